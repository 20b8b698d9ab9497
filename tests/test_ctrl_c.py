"""Ctrl-C means one thing: stop after the round; twice: abort now, the last checkpoint kept. In the
dashboard (a real Textual pilot driving a real node process) as headless (a real terminal's Ctrl-C
reaches the whole process group: the grader workers print no traceback)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ftis_edge.store import checkpoint, rundir
from ftis_edge.metrics.records import read_control, read_metrics
from ftis_edge.store.progress import GENERATING, read_progress
from ftis_edge.tui import DashboardApp
from dashboard import wait_for as settle
from procs import ROOT, rounds_of, wait_for, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]
SMALL = dict(node={"rounds": 50, "checkpoint_every": 1}, eval={"every": 0})


def test_headless_ctrl_c_stops_after_the_round_without_tracebacks(tmp_path):
    cfg = write_config(tmp_path, "h", **SMALL)
    run = tmp_path / "h"
    node = subprocess.Popen([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg), "--headless"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert wait_for(lambda: len(rounds_of(run)) >= 1, 300)
        os.killpg(node.pid, signal.SIGINT)            # what a terminal does: the node and its grader workers
        out, _ = node.communicate(timeout=300)
    finally:
        if node.poll() is None:
            node.kill()
    assert node.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert "stopping after this round (SIGINT); press Ctrl-C again to abort" in out
    assert read_metrics(run)[-1]["reason"] == "signal"


def in_round_2(run) -> bool:
    progress = read_progress(run) or {}
    return progress.get("round") == 2 and progress.get("phase") == GENERATING


async def test_ctrl_c_in_the_dashboard_stops_then_aborts_keeping_the_checkpoint(tmp_path):
    cfg = write_config(tmp_path, "d", **SMALL)
    run = tmp_path / "d"
    proc, stderr = rundir.spawn_node([sys.executable, "-m", "ftis_edge.cli", "start", "--headless", str(cfg)], run)
    app = DashboardApp(run, node_process=proc, poll_interval=0.2, node_stderr=stderr)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            # the first Ctrl-C inside round 2 (not while round 1 checkpoints: that stop completes
            # at once and leaves no round for the second Ctrl-C to abort)
            while not in_round_2(run) and proc.poll() is None:
                await pilot.pause(0.2)
            await pilot.press("ctrl+c")
            await pilot.pause(0.2)
            assert read_control(run)["stop"] and app.is_running      # not Textual's "press ctrl+q"
            await pilot.press("ctrl+c")
            proc.wait(120)
            await settle(pilot, lambda: app.return_code is not None, 10)     # the dashboard saw it end
        stop = read_metrics(run)[-1]
        assert proc.returncode == 130 and stop["reason"] == "aborted", (proc.returncode, stop)
        assert checkpoint.complete(run) and checkpoint.complete(run)[-1] >= 1        # the checkpoint is kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
