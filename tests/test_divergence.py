"""A recipe cannot wreck a model unseen: the learning rate follows train.trainable unless set, and a
node whose own training collapses says so in words (record, log, dashboard) with the likely cause
and the setting to change."""
from __future__ import annotations

import subprocess
import sys

import pytest
from textual.widgets import Static

from ftis_edge import config
from ftis_edge.run.divergence import DivergenceWatch, learning_rate_note
from ftis_edge.metrics.records import read_rounds
from ftis_edge.tui import DashboardApp
from procs import ROOT, finish, rounds_of, start_node, write_config
from dashboard import FAST, append, cell, live_copy, plain, wait_for

ISSUE_ROUNDS = [   # bob, full fine-tuning at the LoRA rate the init file wrote (issue numbers)
    {"round": 1, "format/own": 0.21, "completions/mean_length": 48.0},
    {"round": 2, "format/own": 0.0, "completions/mean_length": 122.0},
]


def test_init_file_with_the_readme_full_recipe_gets_the_full_rate(tmp_path):
    """`ftis-edge init`, then the README's second-node lines pasted in: 5e-6, not LoRA's 1e-4."""
    path = tmp_path / "bob.toml"
    out = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "init", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = path.read_text()
    assert 'learning_rate = "auto"' in text
    text = text.replace('backend = "auto"', 'backend = "hf"').replace('trainable = "lora"', 'trainable = "full"')
    path.write_text(text)
    cfg = config.load(path)
    assert (cfg.train.trainable, cfg.train.learning_rate, cfg.train.lr) == ("full", "auto", 5e-6)
    assert config.load(None).train.lr == 1e-4                    # LoRA keeps today's rate
    assert config.from_dict({"train": {"trainable": "full", "learning_rate": 2e-5}}).train.lr == 2e-5
    with pytest.raises(config.ConfigError, match='expected a number or "auto"'):
        config.from_dict({"train": {"learning_rate": "fast"}})
    # a rate set by hand far above what suits full fine-tuning is said before the first round
    note = learning_rate_note(config.from_dict({"train": {"trainable": "full", "learning_rate": 1e-4}}))
    assert note and "20x the usual 5e-06 for full fine-tuning" in note and '"auto"' in note


def test_the_issue_collapse_is_named_with_cause_and_setting():
    cfg = config.from_dict({"train": {"trainable": "full", "learning_rate": 1e-4},
                            "task": {"max_completion_length": 128}})
    watch = DivergenceWatch(cfg)
    assert watch.observe(ISSUE_ROUNDS[0], kl_own=0.0) is None
    msg = watch.observe(ISSUE_ROUNDS[1], kl_own=1909.0)
    assert msg.startswith("training is diverging since round 2: its own KL is 1.91e+03")
    assert "format 21% -> 0%" in msg and "122 of 128 tokens" in msg
    assert "train.learning_rate = 0.0001 is 20x the usual 5e-06 for full fine-tuning" in msg
    assert watch.is_new(msg) and not watch.is_new(watch.observe({"round": 3, "format/own": 0.0}, 212127.0))


def test_noise_of_a_healthy_run_is_not_divergence():
    """Small groups swing: one weak sign (format dipping, one long round) is not a verdict."""
    watch = DivergenceWatch(config.from_dict({"task": {"max_completion_length": 40}}))
    for rnd, (fmt, length, kl) in enumerate([(0.5, 26, 1e-5), (0.0, 30, 2e-5), (0.5, 40, 1e-4),
                                             (0.25, 24, None), (0.75, 31, 0.02)], start=1):
        assert watch.observe({"round": rnd, "format/own": fmt, "completions/mean_length": length}, kl) is None


async def test_dashboard_says_training_diverges(tmp_path):
    run = live_copy(tmp_path)
    last = read_rounds(run)[-1]
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.query_one("#diverging", Static).has_class("hidden")
        message = ("training is diverging since round 9: format 50% -> 0%, answers run to the limit; likely "
                   'cause: train.learning_rate = 0.05 is 500x the usual 0.0001 for LoRA; set '
                   'train.learning_rate = "auto"')
        append(run, {**last, "type": "round", "round": last["round"] + 1, "train/diverging": message})
        await wait_for(pilot, lambda: cell(app, "state") == "diverging")
        box = app.query_one("#diverging", Static)
        assert not box.has_class("hidden") and plain(box) == message
        assert "training is diverging" in app.sub_title
        append(run, {**last, "type": "round", "round": last["round"] + 2, "train/diverging": None})
        await wait_for(pilot, lambda: app.query_one("#diverging", Static).has_class("hidden"))


@pytest.mark.slow       # a real node/relay process end to end: CI's slow tier (README command < 20 min)
@pytest.mark.model
@pytest.mark.timeout(600)
def test_a_node_at_a_wrecking_rate_says_so_in_its_log_and_records(tmp_path):
    """The real SmolLM2 at 500x its LoRA rate: collapses in a round, and the node says why."""
    cfg = write_config(tmp_path, "bob", node={"rounds": 3, "checkpoint_every": 100},
                       train={"learning_rate": 0.05}, eval={"every": 0})
    out = finish(start_node(cfg))
    assert "train.learning_rate = 0.05 is 500x the usual 0.0001 for LoRA" in out
    rounds = rounds_of(tmp_path / "bob")
    assert rounds[0]["train/diverging"] is None and rounds[0]["kl/own_mean"] < 0.1
    said = [r["train/diverging"] for r in rounds if r["train/diverging"]]
    assert said and 'train.learning_rate = "auto"' in said[-1]
    assert out.count("WARNING training is diverging") == 1          # once per episode, not per round
    assert "training is diverging" in (tmp_path / "bob" / "node.log").read_text()
