"""H7's nodes that run on past R (experiments/repro/runon.py): the round-R checkpoint survives the
node's rotation of its own, the runner stops them only once the arm's slowest node has its "steps"
stop, a restart neither redoes nor loses them, and their evals score round R. Real checkpoints
(checkpoint.save) and a real process that stops on SIGINT; no model is loaded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from experiments.repro import batches, run, runon
from ftis_edge.store import checkpoint
from procs import wait_for

R = 3


def _node(run_dir: Path, rounds: int, stop: str | None = None) -> None:
    """What a node leaves after ROUNDS rounds: config, records, a checkpoint every round (the node's
    own rotation keeps the newest two)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text('[node]\nid = "node-0"\n[train]\ntrainable = "lora"\n')
    recs = [{"type": "start"}] + [{"type": "round", "round": k} for k in range(1, rounds + 1)]
    recs += [{"type": "stop", "reason": stop}] if stop else []
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for k in range(1, rounds + 1):
        if k not in checkpoint.complete(run_dir):
            checkpoint.save(run_dir, k, {"round": k, "learner": {"w": torch.full((4,), float(k))}})


def _sleeper() -> subprocess.Popen:
    """A process in its own session that exits on SIGINT, as a node does after its round. It sets its
    SIGINT handler itself, as the node does: a Python started with SIGINT ignored (pytest under
    `nohup ... &`) keeps ignoring it."""
    code = ("import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "print('ready', flush=True)\nwhile True: time.sleep(0.1)")
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, stderr=subprocess.DEVNULL)
    assert proc.stdout.readline() == "ready\n"      # a SIGINT before its handler was set would be lost
    return proc


def test_the_round_r_checkpoint_outlives_the_nodes_rotation(tmp_path):
    rd = tmp_path / "worth-0"
    _node(rd, R - 1)
    assert not runon.keep(rd, R) and not runon.kept(rd, R)         # not written yet
    _node(rd, R)
    assert runon.keep(rd, R)
    _node(rd, R + 3)                                                # the node removes its own round R
    assert R not in checkpoint.complete(rd)
    state = checkpoint.load_round(runon.snapshot_dir(rd), R)        # verified against its manifest
    assert torch.equal(state["learner"]["w"], torch.full((4,), float(R)))
    assert (runon.snapshot_dir(rd) / "config.toml").read_text() == (rd / "config.toml").read_text()
    assert runon.keep(rd, R)                                        # kept once, not redone
    runon.reset(rd)
    assert not runon.kept(rd, R)


def test_the_runner_stops_a_run_on_node_only_after_the_slowest_stops(tmp_path):
    rd, slow = tmp_path / "worth-0", tmp_path / "worth-3"
    _node(rd, R + 1)
    _node(slow, R - 1)
    watch = runon.Watch({"worth-0": (rd, slow)}, R, run.finished)
    proc = _sleeper()
    try:
        assert watch.poll({"worth-0": proc}) == [] and proc.poll() is None       # node 3 still training
        assert runon.kept(rd, R)                                                  # round R put aside already
        _node(slow, R, stop="user")
        assert watch.poll({"worth-0": proc}) == [] and proc.poll() is None       # stopped, but not done
        _node(slow, R, stop="steps")
        said = watch.poll({"worth-0": proc})
        assert said and "worth-3 has stopped" in said[0]
        # SIGINT reached it (asserted: a starved sleeper on a loaded machine once read as 'nothing said')
        assert wait_for(lambda: proc.poll() is not None, 120)
        assert not run.finished(rd, runs_on=True)
        assert "scored on its round-3 checkpoint" in watch.poll({"worth-0": proc})[0]
    finally:
        proc.kill()
        proc.wait()
    assert run.finished(rd, runs_on=True) and runon.scored_round(rd) == R
    assert not run.finished(rd)             # its own stop record says nothing of "steps"


def test_a_restarted_seed_resumes_unfinished_nodes_and_leaves_done_ones(tmp_path):
    """Killed with the slowest node finished and a run-on node past R: the restart marks it done
    without starting it. A run-on node short of R is started (resumed) and stopped at R."""
    batch = batches.BATCHES["h7"]
    out = tmp_path / "s0"
    _node(out / "ftis-0", R)
    assert runon.keep(out / "ftis-0", R)            # the earlier runner saw its round R
    _node(out / "ftis-0", R + 2, stop="signal")
    _node(out / "ftis-1", R - 1)
    _node(out / "ftis-3", R, stop="steps")
    cfgs = run.receiver_configs(batch, 0, R, out, "tcp://127.0.0.1:1", "s")
    # a runner beside this one, for the twins alone, leaves the arms' nodes to their own runner
    assert run.watch_for(batch, cfgs, out, R, {"alone-0", "alone-3"}).poll({}) == []
    assert runon.scored_round(out / "ftis-0") is None
    said = run.watch_for(batch, cfgs, out, R, None).poll({})
    assert said == ["ftis-0: done, scored on its round-3 checkpoint"]
    todo = [n for n in cfgs if n.startswith("ftis") and not run.finished(out / n, run.runs_on(batch, n))]
    assert todo == ["ftis-1", "ftis-2"]
    assert run.node_command(out / "ftis-1.toml", out / "ftis-1")[-1] == "--resume"


def test_a_run_on_node_is_exported_and_scored_at_round_r(tmp_path):
    batch = batches.BATCHES["h7"]
    out = tmp_path / "s0"
    for name, trainable in (("worth-0", "lora"), ("worth-2", "full")):
        _node(out / name, R + 1, stop="signal")
        (out / name / "config.toml").write_text(f'[node]\nid = "x"\n[train]\ntrainable = "{trainable}"\n')
        (out / name / "adapter").mkdir()
        (out / name / "adapter" / "adapter-v000004.gguf").write_bytes(b"4")     # round R + 1's, not scored
        runon.keep(out / name, R)
        runon.mark(out / name, R, "worth-3")
    jobs = {cmd[-1].split()[2]: cmd for cmd, _ in run.eval_jobs(batch, 0, out, 200, only={"worth-0", "worth-2"})}
    lora, full = jobs[str(out / "worth-0" / "scored")], jobs[str(out / "worth-2" / "scored")]
    for script, name in ((lora, "worth-0"), (full, "worth-2")):
        snap = out / name / "scored"
        assert script[:2] == ["sh", "-c"]
        assert f"export {snap} --to {snap / 'export'} --quant f16 --eval-limit 0 --latest" in script[2]
        assert f"--json {out / name / 'eval-id.json'}" in script[2] and "eval-ood.json" in script[2]
        assert "adapter-v000004" not in script[2]
    assert f"ln -f {out / 'worth-0/scored/export/adapter.gguf'} {out / 'worth-0/scored/adapter/latest.gguf'}" in lora[2]
    assert lora[2].count(f"--model {out / 'worth-0' / 'scored'}") == 2
    assert full[2].count(f"--model {out / 'worth-2/scored/export/model-f16.gguf'}") == 2


def test_a_lost_round_r_checkpoint_is_said_not_scored(tmp_path):
    """A node whose round R went by with no runner watching (its runner killed, the node not):
    nothing to score as registered, said once, never marked done."""
    rd, slow = tmp_path / "worth-0", tmp_path / "worth-3"
    _node(rd, R + 2, stop="signal")
    _node(slow, R, stop="steps")
    watch = runon.Watch({"worth-0": (rd, slow)}, R, run.finished)
    said = watch.poll({})
    assert len(said) == 1 and "round-3 checkpoint was not kept" in said[0], said
    assert watch.poll({}) == [] and runon.scored_round(rd) is None


def test_a_node_slower_than_the_one_it_waits_for_is_stopped_in_its_round_r(tmp_path):
    """H6's full-FT node was slower than the Gemma node: it gets its SIGINT while in round R (by its
    own progress.json, never an earlier process's), so it ends after round R, not a round later."""
    rd, slow = tmp_path / "worth-2", tmp_path / "worth-3"
    _node(rd, R - 1)
    _node(slow, R, stop="steps")
    watch = runon.Watch({"worth-2": (rd, slow)}, R, run.finished)
    proc = _sleeper()
    try:
        (rd / "progress.json").write_text(json.dumps({"pid": proc.pid + 1, "round": R, "phase": "generating"}))
        assert watch.poll({"worth-2": proc}) == [] and proc.poll() is None       # another process's file
        (rd / "progress.json").write_text(json.dumps({"pid": proc.pid, "round": R - 1, "phase": "generating"}))
        assert watch.poll({"worth-2": proc}) == [] and proc.poll() is None       # round R - 1: not yet
        (rd / "progress.json").write_text(json.dumps({"pid": proc.pid, "round": R, "phase": "generating"}))
        assert watch.poll({"worth-2": proc}) == ["worth-2: worth-3 has stopped, stopping it after its round 3"]
        assert wait_for(lambda: proc.poll() is not None, 120)      # the SIGINT reached it
    finally:
        proc.kill()
        proc.wait()
    assert watch.poll({"worth-2": proc}) == [] and runon.scored_round(rd) is None   # its round R not written
    _node(rd, R, stop="signal")                                                      # the stop writes it
    assert watch.poll({"worth-2": proc}) == ["worth-2: done, scored on its round-3 checkpoint"]


def test_slowest_every_node_of_an_arm_serves_until_all_have_reached_round_r(tmp_path):
    """Issue 65.5 (H8's claim failed on a pair whose peers stopped at R first): with run_on_until =
    "slowest" no node of an arm is stopped while another is short of round R, whichever it is;
    then each is stopped and scored at R. The twins alone run their R rounds as before."""
    import dataclasses
    batch = dataclasses.replace(batches.BATCHES["h8"], run_on_until="slowest")
    out = tmp_path / "s0"
    cfgs = run.receiver_configs(batch, 0, R, out, "tcp://127.0.0.1:1", "s")
    arm = [f"ftis-{i}" for i in range(4)]
    assert all(run.runs_on(batch, n) and cfgs[n]["node"]["rounds"] == runon.limit(R) for n in arm)
    assert not run.runs_on(batch, "alone-0") and cfgs["alone-0"]["node"]["rounds"] == R
    assert run.waits_for(batch, "ftis-2") == ("ftis-0", "ftis-1", "ftis-3")
    for name, rounds in zip(arm, (R + 1, R + 1, R, R - 1)):     # ftis-3 is the slowest this time
        _node(out / name, rounds)
    watch = run.watch_for(batch, cfgs, out, R, set(arm))
    procs = {n: _sleeper() for n in arm}
    try:
        assert watch.poll(procs) == [] and all(p.poll() is None for p in procs.values())   # ftis-3 short of R
        assert all(runon.kept(out / n, R) for n in arm[:3])
        _node(out / "ftis-3", R)
        said = watch.poll(procs)
        assert len(said) == 4 and all("every node of its arm reached round 3" in line for line in said), said
        assert wait_for(lambda: all(p.poll() is not None for p in procs.values()), 120)
        said = watch.poll(procs)
        assert sorted(said) == sorted(f"{n}: done, scored on its round-3 checkpoint" for n in arm)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert all(runon.scored_round(out / n) == R for n in arm)
    assert json.loads((out / "ftis-0" / runon.MARK).read_text())["until"] == "the slowest of its arm"


def test_reached_counts_a_round_r_that_went_by_unwatched(tmp_path):
    rd = tmp_path / "ftis-1"
    _node(rd, R - 1)
    assert not runon.reached(rd, R)
    _node(rd, R + 2)                    # the node's rotation keeps R + 1 and R + 2 only
    assert R not in checkpoint.complete(rd) and runon.reached(rd, R) and not runon.kept(rd, R)
