"""Two nodes on one PC: a node finds the other node processes on the machine and takes its share of the cores."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ftis_edge.neighbours import Neighbour, _node_config, other_nodes, threads_for

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
