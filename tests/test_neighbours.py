"""Two nodes on one PC: a node finds the other node processes on the machine and takes its share of the cores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ftis_edge.run.neighbours import Neighbour, _node_config, other_nodes, threads_for

SLEEPER = "import time; time.sleep(60)"


def _wait_seen(pid: int, timeout: float = 10.0) -> list[Neighbour]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = other_nodes()
        if any(n.pid == pid for n in found):
            return found
        time.sleep(0.1)
    return other_nodes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_second_real_process_starting_a_node_is_found_and_the_cores_are_shared(tmp_path):
    # a real process whose command line is a node's (`python -c ... -m ftis_edge.cli start FILE`):
    # what the scan reads is its /proc cmdline, like any node started from a shell
    other = subprocess.Popen([sys.executable, "-c", SLEEPER, "-m", "ftis_edge.cli", "start",
                              str(tmp_path / "bob.toml"), "--headless"])
    bystander = subprocess.Popen([sys.executable, "-c", SLEEPER, "-m", "ftis_edge.cli", "eval"])
    try:
        found = _wait_seen(other.pid)
        mine = [n for n in found if n.pid == other.pid]
        assert mine == [Neighbour(other.pid, str(tmp_path / "bob.toml"))]
        assert bystander.pid not in {n.pid for n in found}          # `ftis-edge eval` is not a node
        threads, note = threads_for(0, cores=16, others=mine)
        assert threads == 8 and f"pid {other.pid}" in note and "model.threads = 8" in note
        assert threads_for(3, cores=16, others=mine) == (3, None)   # an explicit setting is kept
    finally:
        for p in (other, bystander):
            p.kill()
            p.wait()
    assert other.pid not in {n.pid for n in other_nodes()}          # gone: nothing stale is left


def test_alone_every_core_and_no_note():
    assert threads_for(0, cores=12, others=[]) == (12, None)
    assert threads_for(0, cores=2, others=[Neighbour(1, ""), Neighbour(2, ""), Neighbour(3, "")])[0] == 1


@pytest.mark.parametrize("argv,config", [
    (["/usr/bin/python3", "-m", "ftis_edge.cli", "start", "alice.toml", "--headless"], "alice.toml"),
    ([".venv/bin/python", "/x/.venv/bin/ftis-edge", "start", "--resume", "b.toml"], "b.toml"),
    (["/x/.venv/bin/ftis-edge", "start"], ""),
    (["/x/.venv/bin/ftis-edge", "watch", "runs/a"], None),
    (["python", "-m", "pytest", "tests/test_node.py"], None),
])
def test_which_command_lines_are_nodes(argv, config):
    assert _node_config(argv) == config


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_dashboard_and_its_node_count_once(tmp_path):
    """`ftis-edge start bob.toml` in a terminal is two processes: the dashboard and its child node
    (`start --headless`). A friend's node beside it must see one neighbour, not two."""
    cfg = str(tmp_path / "bob.toml")
    child = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, '-m', "
             f"'ftis_edge.cli', 'start', '--headless', {cfg!r}, '--log-file-only']); print(p.pid, flush=True); "
             f"time.sleep(60)")
    dashboard = subprocess.Popen([sys.executable, "-c", child, "-m", "ftis_edge.cli", "start", cfg],
                                 stdout=subprocess.PIPE, text=True)
    node_pid = int(dashboard.stdout.readline())
    try:
        deadline = time.time() + 10
        while time.time() < deadline and node_pid not in {n.pid for n in other_nodes()}:
            time.sleep(0.1)                                 # until the child has exec'd its command line
        found = [n for n in other_nodes() if n.config == cfg]
        assert [n.pid for n in found] == [node_pid]                        # the node, not its dashboard
        threads, note = threads_for(0, cores=8, others=found)
        assert threads == 4 and "1 other ftis-edge node(s)" in note        # the README's 8-core example
    finally:
        os.kill(node_pid, signal.SIGKILL)
        dashboard.kill()
        dashboard.wait()
