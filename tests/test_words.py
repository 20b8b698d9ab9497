"""Words, not dumps: the stop summary as a short block (what ran, best held-out accuracy, resume with
its relay, export), "steps" said as "all rounds done", `init --task reasoning_gym`, a pasted second
[task] named as such, a peer restored from a checkpoint not "last seen 20789d"."""
from __future__ import annotations

import orjson
import pytest

from ftis_edge.store import checkpoint, rundir
from ftis_edge import config
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import PeersTable
from procs import cli
from dashboard import live_copy


def _records(run, *records) -> None:
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def test_stop_summary_is_a_short_block_with_best_held_out_and_the_relay(tmp_path):
    run = tmp_path / "alice"
    _records(run, {"type": "start", "relay": "tcp://10.0.0.2:5555", "config": {"node": {"rounds": 30}}},
             {"type": "round", "round": 1, "eval/base_accuracy": 0.25},
             {"type": "round", "round": 5, "eval/accuracy": 0.41},
             {"type": "round", "round": 10, "eval/accuracy": 0.38},
             {"type": "stop", "round": 10, "reason": "user"})
    checkpoint.save(run, 10, {"round": 10})
    block = rundir.stop_summary(run, config="alice.toml", program="ftis-edge").splitlines()
    assert block[0] == "stopped after round 10 of 30: stopped from the dashboard (q, Ctrl-C, or S then y)"
    assert block[2] == "  held-out  best 41% at round 5 (base model 25%), 38% at the end"
    assert block[3] == (f"  resume    ftis-edge start --run-dir {run} --resume   "
                        f"(rejoins tcp://10.0.0.2:5555)")
    assert len(block) <= 6 and all(len(line) < 160 for line in block)
    _records(run, {"type": "start", "relay": None}, {"type": "round", "round": 3},
             {"type": "stop", "round": 3, "reason": "steps"})
    block = rundir.stop_summary(run, program="ftis-edge").splitlines()
    assert block[0] == "stopped after round 3: all rounds done" and "held-out" not in "\n".join(block)


def test_the_stop_summary_says_when_no_eval_beat_the_base_and_when_the_set_is_too_small(tmp_path):
    """best.py's one rule: the base model's eval (round 0) takes part; an equal later eval does not beat it."""
    run = tmp_path / "small"
    _records(run, {"type": "start", "relay": None},
             {"type": "base_eval", "round": 0, "eval/base_accuracy": 0.2, "eval/n": 5},
             {"type": "round", "round": 3, "eval/accuracy": 0.2, "eval/round": 3, "eval/n": 5},
             {"type": "round", "round": 9, "eval/accuracy": 0.2, "eval/round": 9, "eval/n": 5},
             {"type": "stop", "round": 9, "reason": "steps"})
    block = rundir.stop_summary(run, program="ftis-edge").splitlines()
    assert block[2] == ("  held-out  no eval beat the base model (20%), 20% at the end; "
                        "too few held-out prompts to tell: 5 < 6")


def test_init_writes_the_reasoning_gym_section_and_a_pasted_second_task_is_named(tmp_path):
    path = tmp_path / "gym.toml"
    out = cli("init", str(path), "--task", "reasoning_gym")
    assert out.returncode == 0, out.stderr
    task = config.load(path).task
    assert task.name == "reasoning_gym" and task.reward == "shaped"
    assert set(task.datasets) == {"chain_sum", "basic_arithmetic", "leg_counting"}
    assert cli("init", str(tmp_path / "x.toml"), "--task", "nonsense").returncode == 2
    # the README's [task] block pasted under an init file's own [task]
    plain = tmp_path / "bob.toml"
    assert cli("init", str(plain)).returncode == 0
    plain.write_text(plain.read_text() + '\n[task]\nname = "reasoning_gym"\nreward = "shaped"\n')
    out = cli("start", str(plain), "--headless")
    assert out.returncode == 2
    err = out.stderr.strip()
    assert err.startswith(f"ftis-edge: error: {plain}: [task] appears twice (at line ") and "Cannot declare" not in err
    assert "replace that [task] instead of adding another" in err


async def test_a_peer_restored_from_a_checkpoint_is_not_last_seen_decades_ago(tmp_path):
    run = live_copy(tmp_path)
    lines = (run / "metrics.jsonl").read_bytes().splitlines()
    last = orjson.loads(lines[-1])
    name = next(iter(last["peers"]))
    last["peers"][name]["last_seen"] = 0.0       # what a resumed node's peer book held before
    (run / "metrics.jsonl").write_bytes(b"\n".join([*lines[:-1], orjson.dumps(last)]) + b"\n")
    app = DashboardApp(run, poll_interval=0.05)
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        table = app.query_one(PeersTable)
        seen = table.get_cell(name, "last_seen").plain
        assert seen == "–" or seen == "-" or "d" not in seen, seen


async def test_the_reward_plot_tells_own_peers_and_all_apart_and_draws_a_trend():
    from dashboard import FIXTURE, ROUNDS
    from ftis_edge.tui.widgets import trend_line
    assert trend_line([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]) == [0.0, 0.5, 1 / 3, 0.5, 0.4, 0.6]
    app = DashboardApp(FIXTURE, poll_interval=0.05)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        monitor = app.query_one("#panel-reward PlotextPlot").plt._active.monitor
        markers = [m[0] for m in monitor.marker]
        assert len(markers) == 4 and len(set(markers)) == 4           # own, its trend, peers, all: 4 styles
        own = [r["reward/own"] for r in ROUNDS if r.get("reward/own") is not None]
        assert monitor.y[1] == pytest.approx(trend_line(own)[-len(monitor.y[1]):])


def test_the_too_few_threshold_is_where_the_exact_mcnemar_test_can_first_say_anything():
    from ftis_edge.metrics.best import ALPHA, MIN_PROMPTS
    from ftis_edge.metrics.stats import mcnemar_two_sided
    assert MIN_PROMPTS == 6
    assert mcnemar_two_sided(MIN_PROMPTS, 0) < ALPHA <= mcnemar_two_sided(MIN_PROMPTS - 1, 0)
