"""A failing node says so in one line — on the terminal, and on the dashboard that started it
(Textual's real pilot, a real node process) — with the traceback in node.log."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftis_edge.store import rundir
from ftis_edge.metrics.records import read_metrics
from ftis_edge.tui import DashboardApp
from dashboard import wait_for as settle
from procs import ROOT


def run(*args):
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def node_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nid = "n"\nrun_dir = "{tmp_path}/run"\n{extra}')
    return path


def test_resume_without_a_checkpoint_is_one_line_and_exit_2(tmp_path):
    cfg = node_file(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"type":"start"}\n')
    r = run("start", str(cfg), "--headless", "--resume")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftis-edge: error: --resume: no checkpoint in")
    assert "--resume-or-fresh" in lines[0]
    r = run("start", str(cfg), "--headless", "--resume", "--overwrite")
    assert r.returncode == 2 and "pick one" in r.stderr


@pytest.mark.slow       # a real node/relay process end to end: CI's slow tier (README command < 20 min)
def test_an_unexpected_crash_is_one_line_with_the_traceback_in_node_log(tmp_path):
    cfg = node_file(tmp_path)
    (tmp_path / "run" / "config.toml").mkdir(parents=True)     # the node cannot write its config
    r = run("start", str(cfg), "--headless")
    assert r.returncode == 1
    # (config.toml is written once the weights have loaded: the load's log lines come first)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("ftis-edge: error:")]
    assert len(lines) == 1 and r.stderr.strip().splitlines()[-1] == lines[0], r.stderr
    assert lines[0].startswith("ftis-edge: error: IsADirectoryError:") and "node.log" in lines[0]
    log = (tmp_path / "run" / "node.log").read_text()
    assert "Traceback (most recent call last)" in log and "IsADirectoryError" in log


def test_a_bad_model_is_one_line_in_node_log_and_a_stop_record(tmp_path):
    cfg = node_file(tmp_path, f'[model]\nspec = "{tmp_path}/missing.gguf"\n')
    r = run("start", str(cfg), "--headless")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"ftis-edge: error: model '{tmp_path}/missing.gguf': file not found: {tmp_path}/missing.gguf"]
    log = (tmp_path / "run" / "node.log").read_text()
    assert f"{tmp_path}/missing.gguf': file not found: {tmp_path}/missing.gguf" in log and "Traceback" not in log


async def test_a_node_failure_reaches_the_dashboard_that_started_it(tmp_path):
    cfg = node_file(tmp_path, f'[model]\nspec = "{tmp_path}/missing.gguf"\n')
    run_dir = tmp_path / "run"
    proc, stderr_file = rundir.spawn_node(
        [sys.executable, "-m", "ftis_edge.cli", "start", "--headless", str(cfg)], run_dir)
    app = DashboardApp(run_dir, node_process=proc, node_stderr=stderr_file, poll_interval=0.05)
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            deadline = time.monotonic() + 240
            while app.failure is None:
                assert time.monotonic() < deadline, "the dashboard never saw the failure"
                await pilot.pause(0.2)
            await pilot.pause(0.2)
            expected = f"model '{tmp_path}/missing.gguf': file not found: {tmp_path}/missing.gguf"
            assert app.failure == expected
            assert app.sub_title.startswith(f"failed: {expected}")
            assert any(expected in str(n.message) for n in app._notifications)
            # no traceback exists for this failure: the toast does not point to one
            assert not any("traceback" in str(n.message) for n in app._notifications)
            await pilot.press("7")                      # the Log tab
            from textual.widgets import Log
            await settle(pilot, lambda: any(expected in line for line in app.query_one("#log", Log).lines))
            assert any(expected in line for line in app.query_one("#log", Log).lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    # the terminal gets the same line when the dashboard closes
    summary = rundir.stop_summary(run_dir, exit_code=proc.returncode,
                                      failure=rundir.last_error_line(*stderr_file))
    # a user's mistake leaves no traceback in node.log, so none is promised (nor a resume: no checkpoint)
    assert summary == f"failed after round 0: {expected}"
    # a start-up failure happens before the metrics exist: no stale metrics are left behind
    assert read_metrics(run_dir) == []
