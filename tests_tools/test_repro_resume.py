"""An interrupted experiment resumes: experiments/repro/run.py restarts a node that has a
checkpoint with --resume (its partial run kept), and one without with --overwrite."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ftis_edge.store import checkpoint
from ftis_edge.run import machine
from ftis_edge.metrics.records import read_metrics, read_rounds
from procs import wait_for

ROOT = Path(__file__).resolve().parents[1]
from experiments.repro import run


def test_a_run_with_a_checkpoint_is_resumed_and_one_without_starts_fresh(tmp_path):
    cfg, run_dir = tmp_path / "node.toml", tmp_path / "node"
    assert run.node_command(cfg, run_dir)[-1] == "--overwrite"          # nothing there yet
    (run_dir / "checkpoints" / "round-000002").mkdir(parents=True)      # a checkpoint cut before its state
    assert run.node_command(cfg, run_dir)[-1] == "--overwrite"
    checkpoint.save(run_dir, 3, {"round": 3, "weights": torch.zeros(2)})  # what a node writes
    assert run.node_command(cfg, run_dir)[-1] == "--resume"


def test_a_receiver_a_live_node_holds_is_not_started_again(tmp_path, capsys):
    """Two runners over one seed (one training, one evaluating what finished): a node still in its
    last round is held by its lock, so the second runner leaves it to the first."""
    import subprocess
    import sys
    held, free = tmp_path / "alone-1", tmp_path / "alone-0"
    held.mkdir()
    free.mkdir()
    code = ("import sys, time; from ftis_edge.store import runlock; runlock.acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(held)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "held"
        left = run.not_running({"alone-0": {}, "alone-1": {}, "alone-2": {}}, tmp_path, "[h7 s3]")
        assert list(left) == ["alone-0", "alone-2"]         # alone-2: no run dir yet, a fresh start
        assert f"[h7 s3] alone-1: a node (pid {child.pid}) is running in {held}" in capsys.readouterr().out
    finally:
        child.kill()
        child.wait()
    assert list(run.not_running({"alone-1": {}}, tmp_path, "")) == ["alone-1"]    # its lock went with it


def test_the_machine_record_names_cpu_cores_and_boot():
    record = machine.describe()
    assert record["cpu"] and record["cpu"] != "unknown"
    assert 1 <= record["usable_cores"] <= record["cores"]
    boot = machine.BOOT_ID.read_text().strip() if machine.BOOT_ID.exists() else None
    assert record["boot_id"] == boot
    assert machine.describe()["boot_id"] == record["boot_id"]          # the same boot, the same id


def _rounds(run_dir: Path) -> list[int]:
    if not (run_dir / "metrics.jsonl").exists():
        return []
    return [r["round"] for r in read_rounds(run_dir)]


@pytest.mark.model
@pytest.mark.timeout(600)
@pytest.mark.slow
def test_an_interrupted_run_continues_where_it_stopped(tmp_path):
    """A real node stopped after its first round (as a stopped batch is) and started again by
    run.py's own start_node: rounds 2 and 3 follow round 1, nothing is redone or lost."""
    run_dir = tmp_path / "node"
    cfg = run.write_config({
        "node": {"id": "resumer", "rounds": 3, "checkpoint_every": 1, "run_dir": str(run_dir)},
        "model": {"threads": 1}, "eval": {"every": 0},
        "task": {"prompts_per_round": 1, "num_generations": 2, "max_completion_length": 16},
        "swarm": {"collaboration": "alone"}}, tmp_path / "node.toml")
    proc = run.start_node(cfg, tmp_path / "node.out", run_dir)
    wait_for(lambda: _rounds(run_dir) or proc.poll() is not None, 400)
    run.stop(proc)                              # SIGINT: the node finishes its round and checkpoints
    first = _rounds(run_dir)
    assert first and first[-1] < 3, (first, (tmp_path / "node.out").read_text()[-2000:])

    proc = run.start_node(cfg, tmp_path / "node.out", run_dir)
    assert proc.wait(400) == 0, (tmp_path / "node.out").read_text()[-2000:]

    assert _rounds(run_dir) == [1, 2, 3]
    starts = [r for r in read_metrics(run_dir) if r.get("type") == "start"]
    assert len(starts) == 2 and starts[0]["resumed_from"] is None and starts[1]["resumed_from"] == first[-1]
    # every start says where it ran: a resume on another machine shows in the metrics
    here = machine.describe()
    for s in starts:
        assert s["machine"] == here and s["machine"]["cpu"] and s["machine"]["cores"] >= 1
    assert run.finished(run_dir)


def _finished_run(run_dir: Path, *machines: dict) -> None:
    """A finished receiver as a node writes it: one start record per start, rounds, a stop by steps."""
    run_dir.mkdir(parents=True)
    recs = [{"type": "start", "resumed_from": None, "machine": m} for m in machines]
    recs += [{"type": "round", "round": 1, "reward/own": 0.5}, {"type": "stop", "reason": "steps"}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_analyze_says_when_compared_runs_ran_on_two_machines(tmp_path):
    from experiments.repro import analyze
    here = machine.describe()
    elsewhere = {**here, "cpu": "Another CPU", "boot_id": "0123456789abcdef"}
    seed = tmp_path / "fill4" / "s0"
    _finished_run(seed / "own1-0", here)
    _finished_run(seed / "alone-0", here)
    assert analyze.machine_lines(analyze.load_all(tmp_path)) == []          # one machine: nothing to say
    _finished_run(seed / "own1-1", here, elsewhere)                          # resumed on another machine
    lines = analyze.machine_lines(analyze.load_all(tmp_path))
    assert len(lines) == 1 and "fill4 s0 ran on 2 machines or boots" in lines[0], lines
    assert "Another CPU" in lines[0] and "boot 01234567: own1-1" in lines[0], lines
