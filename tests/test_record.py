"""The run directory is the record (issue 50): a resume that changes what the checkpoint needs is
refused in words before anything loads, a failed start changes nothing, an edited RUN/config.toml
is what a resume without a node file uses; and a crafted best-weights state (issue 51.8) is refused
in one safe line, cheaply, before any model loads.

The resume cases run one real node (procs.TINY, one round, real checkpoints) and resume it with
the real command line."""
from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

import pytest
import torch

from ftis_edge.store import checkpoint, rundir
from ftis_edge import config
from ftis_edge.metrics.records import read_metrics
from testkit.hostile import ESCAPES, GOOD, make_huge, model_shapes, run_with_best
from procs import cli, run_node, write_config

# what a start may write even when it fails: diagnostics and live state, not the run's record
TRANSIENT = {"node.log", "progress.json", "control.json", ".lock", "node.lock", "run.lock"}


def snapshot(run: Path) -> dict[str, str]:
    """Every file of the run's record, by content."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name not in TRANSIENT}


# --- 51.8: a crafted best-weights state -------------------------------------------------------------

def _run_with_best(tmp_path: Path, trainable: dict, info, round_: int = 2) -> Path:
    return run_with_best(tmp_path, trainable, info, round_)      # the attack script's run directory (testkit)


def _export(run: Path):
    return cli("export", str(run), "--eval-limit", "0", timeout=120)


SHAPES = model_shapes()


@pytest.mark.parametrize("info, says", [
    ({**GOOD, "accuracy": ESCAPES},
     "its accuracy is not a number between 0 and 1"),
    ({**GOOD, "n": "\x1b[2J"}, "its prompt count is not a positive whole number"),
    ({**GOOD, "interval": "\u202eevil"}, "its interval is not two numbers between 0 and 1"),
    ("not a table", "its 'best' entry is a str, not a table"),
    ([1, 2], "its 'best' entry is a list, not a table"),
])
def test_crafted_best_fields_are_one_safe_line(tmp_path, info, says):
    r = _export(_run_with_best(tmp_path, dict(SHAPES), info))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr and "best-000002" in r.stderr
    assert not re.search(r"[\x1b\x07\u202e]", r.stdout + r.stderr)        # nothing raw reaches the terminal


def test_a_one_element_tensor_is_not_broadcast_into_the_lora_matrices(tmp_path):
    crafted = {"a.lora_A": torch.ones(1), "a.lora_B": torch.ones(1)}
    r = _export(_run_with_best(tmp_path, crafted, GOOD))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "2 tensors have other shapes (one is (1,), the model's (4, 8))" in r.stderr, r.stderr


def test_a_huge_best_state_is_refused_before_it_is_hashed(tmp_path):
    """A 4 GiB state (sparse: no disk used) is refused by its size against the newest checkpoint,
    in well under the ~50 s that hashing it took."""
    run = _run_with_best(tmp_path, dict(SHAPES), GOOD)
    make_huge(run, 4)
    t0 = time.monotonic()
    with pytest.raises(checkpoint.CheckpointError, match="more than the newest checkpoint's"):
        checkpoint.load_best(run)
    assert time.monotonic() - t0 < 2.0
    r = _export(run)
    assert r.returncode == 2 and "more than the newest checkpoint's" in r.stderr


def test_a_bad_header_is_refused_before_it_is_hashed(tmp_path):
    run = _run_with_best(tmp_path, dict(SHAPES), GOOD)
    state = next((run / "checkpoints").glob("best-*")) / "state.safetensors"
    data = bytearray(state.read_bytes())
    data[:8] = (len(data) * 4).to_bytes(8, "little")                   # a header longer than the file
    state.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="is not a state file .its header claims"):
        checkpoint.load_best(run)


# --- relative paths -----------------------------------------------------------------------------

def test_relative_paths_are_relative_to_the_node_file_not_the_current_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "qa.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n')
    node = folder / "node.toml"
    node.write_text('[node]\nrun_dir = "runs/{id}"\n[task]\nname = "jsonl"\npath = "qa.jsonl"\n')
    runs = set()
    for cwd in (tmp_path, folder, tmp_path / "elsewhere"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        cfg = config.load(os.path.relpath(node, cwd))
        runs.add(cfg.run_path)
        assert cfg.task.path == str(folder / "qa.jsonl")
    assert runs == {folder / "runs" / config.load(node).node_id}         # one run, wherever started
    node.write_text('[task]\nname = "jsonl"\npath = "missing.jsonl"\n')
    with pytest.raises(config.ConfigError, match=re.escape(f"task.path: {folder / 'missing.jsonl'} does not exist")):
        config.load(node)


# --- resume against the record (a real node, real checkpoints) ------------------------------------

@pytest.fixture(scope="module")
def one_round(tmp_path_factory):
    """One round of the default node (procs.TINY), checkpointed: (its node file, its run directory)."""
    folder = tmp_path_factory.mktemp("record")
    cfg = write_config(folder, "rec", node={"rounds": 1, "checkpoint_every": 1})
    run_node(cfg, timeout=1200)
    return cfg, folder / "rec"


def _edit(path: Path, section: str, key: str, value: str) -> None:
    """Set ``key`` in ``[section]`` of a TOML file written by to_toml."""
    text = path.read_text()
    head = text.index(f"[{section}]")
    start = text.index(f"\n{key} = ", head) + 1
    end = text.index("\n", start)
    path.write_text(text[:start] + f"{key} = {value}" + text[end:])


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(1800)
def test_a_resume_that_changes_what_the_checkpoint_needs_is_refused_and_changes_nothing(one_round, tmp_path):
    cfg, run = one_round
    before = snapshot(run)
    changed = tmp_path / "changed.toml"
    changed.write_text(cfg.read_text())
    _edit(changed, "train", "lora_r", "16")
    _edit(changed, "model", "spec", '"gemma3-270m"')
    _edit(changed, "node", "rounds", "3")                 # may change: not what is refused
    r = cli("start", str(changed), "--headless", "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert "  model.spec: 'smollm2-135m' → 'gemma3-270m'" in lines and "  train.lora_r: 8 → 16" in lines
    assert not any("rounds" in ln for ln in lines)
    assert "put them back to resume this run, or start a new run with the new settings" in r.stderr
    assert snapshot(run) == before                        # the record untouched: export still reads it
    # an edit of RUN/config.toml that a resume with the node file would overwrite: refused, said
    record = run / "config.toml"
    original = record.read_text()
    try:
        _edit(record, "train", "learning_rate", "0.0002")
        r = cli("start", str(cfg), "--headless", "--resume")
        assert r.returncode == 2 and "was edited after the run last started (train.learning_rate: 'auto' → 0.0002)" \
            in r.stderr and f"start --run-dir {run} --resume" in r.stderr, r.stderr
        _edit(record, "train", "lora_r", "16")            # the record itself edited where it must not be
        r = cli("start", "--run-dir", str(run), "--headless", "--resume")
        assert r.returncode == 2 and "  train.lora_r: 8 → 16" in r.stderr.splitlines(), r.stderr
    finally:
        record.write_text(original)
    assert snapshot(run) == before


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(1800)
def test_a_start_that_fails_after_loading_leaves_the_record_as_it_was(one_round, tmp_path):
    """No usable checkpoint is found only once the model has loaded: config.toml, the metrics and
    the adapters stay as they were (before: config.toml rewritten, adapter/ deleted, a stop record
    appended), and no resume is offered for the checkpoint that failed."""
    cfg, run = one_round
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(run, copy)
    _edit(copy / "config.toml", "node", "run_dir", f'"{copy}"')
    for state in (copy / "checkpoints").glob("round-*/state.safetensors"):
        state.write_bytes(b"\0" * 64)
    before = snapshot(copy)
    # one round more than the run has done: a complete run is refused before anything loads
    r = cli("start", "--run-dir", str(copy), "--headless", "--resume", "--rounds", "2")
    assert r.returncode == 2 and "no usable checkpoint" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not any(ln.startswith("resume:") for ln in r.stderr.splitlines())
    assert snapshot(copy) == before


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(1800)
def test_an_edited_record_is_what_a_resume_without_a_node_file_uses(one_round):
    """`start --run-dir RUN --resume` (what every exit prints) continues with RUN/config.toml, edits
    included, and says what changed; the default node's settings never replace the run's."""
    cfg, run = one_round
    summary = rundir.stop_summary(run, exit_code=-9, program="ftis-edge")      # a crash still says how to resume
    assert f"resume    ftis-edge start --run-dir {run} --resume" in summary
    _edit(run / "config.toml", "node", "rounds", "2")
    r = cli("start", "--run-dir", str(run), "--headless", "--resume", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resume changes node.rounds: 1 → 2" in r.stderr                 # said, and kept in node.log
    assert "resume changes node.rounds: 1 → 2" in (run / "node.log").read_text()
    assert f"resume: " in r.stderr and r.stderr.splitlines()[-1].endswith(f"start --run-dir {run} --resume")
    start = [x for x in read_metrics(run) if x.get("type") == "start"][-1]
    assert start["resumed_from"] == 1 and start["config"]["node"]["rounds"] == 2
    assert start["config"]["train"]["micro_batch"] == 8 and start["config"]["task"]["num_generations"] == 4
    assert "rounds = 2" in (run / "config.toml").read_text()
    assert (run / "config.toml").read_text().startswith("# The settings of the run in this directory")


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(1800)
def test_export_of_a_run_whose_settings_were_changed_is_one_line(one_round, tmp_path):
    cfg, run = one_round
    record = run / "config.toml"
    original = record.read_text()
    try:
        _edit(record, "train", "lora_r", "16")
        r = cli("export", str(run), "--eval-limit", "0", "--to", str(tmp_path / "out"), "--quant", "f16")
    finally:
        record.write_text(original)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "differs from the settings the run's checkpoints were made with (train.lora_r: 8 → 16)" in r.stderr
