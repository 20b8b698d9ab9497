"""One live node per run directory (runlock.py): a second `ftis-edge start` into a live run is
refused whatever its flags, --overwrite deletes nothing of it, `watch` still reads it, and the lock
dies with the process (real processes, real files)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ftis_edge.store import runlock
from ftis_edge.metrics.records import read_metrics
from procs import ROOT, start_dashboard, start_node, wait_for, write_config

FLAGS = [(), ("--resume",), ("--resume-or-fresh",), ("--overwrite",)]


def second_start(cfg, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg), "--headless", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def refused_everything(cfg, run, pid: int) -> None:
    before = {p.name: p.stat().st_size for p in run.iterdir()}
    for flags in FLAGS:
        out = second_start(cfg, *flags)
        assert out.returncode == 2, (flags, out.stdout, out.stderr)
        err = out.stderr.strip()
        assert err.startswith(f"ftis-edge: error: node pid {pid} is running in {run} (started "), (flags, err)
        assert f"watch it with python -m ftis_edge.cli watch {run}" in err and f"kill -INT {pid}" in err
        assert len(err.splitlines()) == 1
    after = {p.name: p.stat().st_size for p in run.iterdir()}
    assert set(before) <= set(after), "a refused start deleted files of the live run"


def test_a_live_run_refuses_a_second_node_and_overwrite_deletes_nothing(tmp_path):
    cfg = write_config(tmp_path, "alice")
    run = tmp_path / "alice"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"type": "start", "node_id": "alice"}\n')
    (run / "node.log").write_text("round 1: ...\n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from ftis_edge.store import runlock; "
                               "runlock.acquire(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(run)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        refused_everything(cfg, run, holder.pid)
        assert (run / "metrics.jsonl").read_text().startswith('{"type": "start"')
        assert (run / "node.log").read_text() == "round 1: ...\n"
    finally:
        holder.kill()
        holder.wait()
    assert runlock.holder(run) is None             # the kernel dropped it with the process (kill -9)


def test_overwrite_of_a_stopped_run_keeps_no_file_of_it_but_the_lock(tmp_path):
    from ftis_edge.store import rundir
    run = tmp_path / "r"
    (run / "checkpoints" / "000001").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    runlock.acquire(run)
    try:
        rundir.reset(run)
        assert [p.name for p in run.iterdir()] == [runlock.LOCK_FILE]
        assert runlock.holder(run) is not None      # still ours: no second node can lock a new file
    finally:
        runlock.release()
    assert runlock.holder(run) is None


def _hold(run) -> subprocess.Popen:
    """Another live process holding the run directory (as a running node does)."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from ftis_edge.store import runlock; "
                               "runlock.acquire(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(run)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_node_started_from_python_holds_the_run_directory(tmp_path, monkeypatch):
    """Node.run takes the lock itself, not only the CLI: held while it runs and given back at its
    end; in a process that holds it already (the CLI, a dashboard's child) it stays that process's;
    a live node elsewhere refuses it before anything of the run is written."""
    from ftis_edge import config
    from ftis_edge.errors import FtisError
    from ftis_edge.run.node import Node
    cfg = config.load(write_config(tmp_path, "py", eval={"every": 0}))
    run = cfg.run_path
    seen = []

    def build(self):             # where the model would load: who holds the run directory now
        seen.append(runlock.holder(run))
        raise FtisError("stopped before loading a model")

    monkeypatch.setattr(Node, "build", build)
    with pytest.raises(FtisError, match="stopped before"):
        Node(cfg, console_log=False).run()
    assert seen[0]["pid"] == os.getpid() and runlock.holder(run) is None

    runlock.acquire(run)          # as the CLI does before it runs the node
    try:
        with pytest.raises(FtisError, match="stopped before"):
            Node(cfg, console_log=False).run()
        assert seen[1]["pid"] == os.getpid() and runlock.holder(run) is not None    # still the CLI's
    finally:
        runlock.release()

    other = tmp_path / "other"
    holder = _hold(other)
    try:
        cfg2 = config.load(write_config(tmp_path, "py", name="other", eval={"every": 0}))
        with pytest.raises(runlock.RunLocked, match=f"node pid {holder.pid} is running in {other}"):
            Node(cfg2, console_log=False).run()
        assert len(seen) == 2 and not (other / "config.toml").exists() and not (other / "progress.json").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dashboard_hands_the_run_directory_to_the_node_it_starts(tmp_path):
    """`ftis-edge start` in a terminal: the dashboard takes the run directory, hands it to the
    node it starts (a child in a session of its own), and a second start is refused with the
    node's pid, not the dashboard's (a real terminal, real processes; the node is stopped while
    it loads its model)."""
    cfg = write_config(tmp_path, "tty", eval={"every": 0})
    run = tmp_path / "tty"
    dashboard, master = start_dashboard(cfg)
    node = None
    try:
        def the_node_holds_it() -> bool:
            info = runlock.holder(run)
            return bool(info) and info.get("pid") not in (None, dashboard.pid)
        assert wait_for(the_node_holds_it, 240, every_s=0.2), "the dashboard's node never took the run directory"
        node = runlock.holder(run)["pid"]
        out = second_start(cfg)
        assert out.returncode == 2 and f"node pid {node} is running in {run}" in out.stderr, out.stderr
    finally:
        dashboard.kill()
        dashboard.wait()
        if node is not None:
            try:
                os.kill(node, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.close(master)
    assert wait_for(lambda: runlock.holder(run) is None, 30), "the lock outlived its node"


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
@pytest.mark.timeout(600)
def test_two_real_nodes_one_run_directory(tmp_path):
    """The user's walk: a node runs; the same config started again, with each flag, is refused
    with the live node's pid; once that node is killed the run is free (its lock died with it)."""
    cfg = write_config(tmp_path, "alice", node={"rounds": 200, "checkpoint_every": 1000}, eval={"every": 0})
    run = tmp_path / "alice"
    first = start_node(cfg)
    try:
        assert wait_for(lambda: any(r.get("type") == "start" for r in read_metrics(run)), 300), "no start record"
        refused_everything(cfg, run, first.pid)
        assert [r["type"] for r in read_metrics(run)][0] == "start"      # --overwrite deleted nothing
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        time.sleep(0.2)
        out = second_start(cfg, "--resume")
        assert "is running" not in out.stderr and "no checkpoint" in out.stderr, out.stderr
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
