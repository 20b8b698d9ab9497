"""Every way a node stops leaves a checkpoint of its last round (real node processes, the real
SmolLM2): q, q while paused, Ctrl-C, SIGTERM; a damaged newest checkpoint falls back to the
older one. (The end of a run: test_node.test_default_node_alone_writes_metrics_checkpoints_and_adapter.)"""
from __future__ import annotations

import signal
import subprocess

import pytest

from ftis_edge.store import checkpoint
from ftis_edge.metrics.records import read_metrics, write_control
from procs import finish, rounds_of, start_dashboard, start_node, wait_for, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1200)]

SMALL = dict(node={"rounds": 50, "checkpoint_every": 1000},
             task={"prompts_per_round": 1, "num_generations": 2, "max_completion_length": 16})


def n_rounds(run) -> int:
    return len(rounds_of(run))


def starts(run) -> list[int]:
    return [i for i, r in enumerate(read_metrics(run)) if r.get("type") == "start"]


def this_run(run) -> list[dict]:
    """Records since the newest start record (a resumed node appends to the old file)."""
    return read_metrics(run)[starts(run)[-1]:]


def resume_and_wait_for_a_round(cfg, run) -> subprocess.Popen:
    before = len(starts(run))
    p = start_node(cfg, "--resume")
    try:
        assert wait_for(lambda: len(starts(run)) > before and any(r.get("type") == "round" for r in this_run(run)),
                        600, every_s=0.5), "a round after resuming"
    except BaseException:
        p.kill()
        raise
    return p


def stopped_with_checkpoint(run, reason: str) -> int:
    """The stop record's round has a verified checkpoint; returns that round."""
    stop = read_metrics(run)[-1]
    assert stop["type"] == "stop" and stop["reason"] == reason, stop
    assert checkpoint.complete(run)[-1] == stop["round"] > 0
    assert checkpoint.load_round(run, stop["round"])["round"] == stop["round"]
    return stop["round"]


def stop_after_round_1(cfg, run, stop) -> str:
    """Start a fresh node, ``stop(proc)`` once round 1 is recorded; its output once it ended."""
    p = start_node(cfg)
    try:
        assert wait_for(lambda: n_rounds(run) >= 1, 600, every_s=0.5), "round 1"
        stop(p)
        return finish(p, 300)
    finally:
        p.kill()


def test_every_stop_path_writes_a_checkpoint_and_a_damaged_one_falls_back(tmp_path):
    cfg = write_config(tmp_path, "stops", **SMALL)
    run = tmp_path / "stops"

    # q: the dashboard writes control.json {"stop": true} while a round runs
    stop_after_round_1(cfg, run, lambda p: write_control(run, stop=True))
    r1 = stopped_with_checkpoint(run, "user")

    # q while paused: pause after a round, then stop while the node waits
    p = resume_and_wait_for_a_round(cfg, run)
    try:
        write_control(run, pause=True)
        assert wait_for(lambda: "paused" in (run / "node.log").read_text(), 600, every_s=0.5), "the node to pause"
        write_control(run, stop=True)
        out = finish(p, 300)
    finally:
        p.kill()
    r2 = stopped_with_checkpoint(run, "user")
    assert r2 > r1, out[-2000:]

    # a truncated newest checkpoint: resume falls back to the older one, with a warning; Ctrl-C
    state = run / "checkpoints" / f"round-{r2:06d}" / checkpoint.STATE
    state.write_bytes(state.read_bytes()[:1000])
    p = resume_and_wait_for_a_round(cfg, run)
    try:
        assert this_run(run)[0]["resumed_from"] == r1
        p.send_signal(signal.SIGINT)
        out = finish(p, 300)
    finally:
        p.kill()
    assert f"round-{r2:06d} is unusable" in out and "truncated" in out
    r3 = stopped_with_checkpoint(run, "signal")
    assert r3 >= r1 + 1

    # SIGTERM (a service manager stopping the node)
    p = resume_and_wait_for_a_round(cfg, run)
    try:
        p.send_signal(signal.SIGTERM)
        finish(p, 300)
    finally:
        p.kill()
    assert stopped_with_checkpoint(run, "signal") > r3
    # a resume replaces the adapters: only the current run's files remain
    names = sorted(f.name for f in (run / "adapter").glob("adapter-v*.gguf"))   # + latest.gguf, a link
    versions = [int(n.split("-v")[1].split(".")[0]) for n in names]
    assert versions and max(versions) <= read_metrics(run)[-1]["round"], names


def test_sighup_stops_a_headless_node_like_sigterm(tmp_path):
    """Closing the terminal or an SSH drop: the node finishes its round, checkpoints it, logs why."""
    cfg = write_config(tmp_path, "hup", **SMALL)
    run = tmp_path / "hup"
    stop_after_round_1(cfg, run, lambda p: p.send_signal(signal.SIGHUP))
    stopped_with_checkpoint(run, "signal")
    assert "stopping after this round (SIGHUP)" in (run / "node.log").read_text()


def test_sighup_to_the_dashboard_stops_its_node_with_a_checkpoint(tmp_path):
    """A closed terminal with the dashboard in it: the node (in a session of its own, so the
    hangup does not reach it) is told to stop, and stops after its round with a checkpoint."""
    import os

    cfg = write_config(tmp_path, "tty", **SMALL)
    run = tmp_path / "tty"
    p, master = start_dashboard(cfg)
    try:
        assert wait_for(lambda: n_rounds(run) >= 1, 600, every_s=0.5), "round 1 under the dashboard"
        p.send_signal(signal.SIGHUP)
        assert p.wait(30) == 128 + signal.SIGHUP
        assert wait_for(lambda: read_metrics(run)[-1].get("type") == "stop", 300, every_s=0.5), "the node's stop record"
    finally:
        p.kill()
        os.close(master)
    stopped_with_checkpoint(run, "signal")
    assert "stopping after this round (SIGTERM)" in (run / "node.log").read_text()
