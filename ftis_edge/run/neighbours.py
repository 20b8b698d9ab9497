"""Other ftis-edge nodes on this machine, so that two nodes on one PC do not both take every core.

A node is a process whose command line runs ``ftis_edge.cli start`` (or the ``ftis-edge start``
script). Found by reading /proc (Linux; elsewhere none are found and nothing changes): no lock
or pid file, so a node that was killed leaves nothing stale behind.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Neighbour:
    pid: int
    config: str          # the node file it was started with ("" when none was named)


def _node_config(argv: list[str]) -> str | None:
    """The config argument when ``argv`` starts a node, else None."""
    for i, arg in enumerate(argv):
        if arg == "ftis_edge.cli" or Path(arg).name == "ftis-edge":
            rest = argv[i + 1:]
            if rest[:1] == ["start"]:
                named = [a for a in rest[1:] if not a.startswith("-")]
                return named[0] if named else ""
            return None
    return None


def other_nodes(proc: Path = Path("/proc")) -> list[Neighbour]:
    """Running nodes other than this process (and its parent: ``ftis-edge start`` may re-exec)."""
    mine = {os.getpid(), os.getppid()}
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:            # gone meanwhile, or another user's hidden process
            continue
        config = _node_config([a.decode(errors="replace") for a in argv if a])
        if config is not None:
            found.append((Neighbour(int(entry.name), config), _parent(entry)))
    # a dashboard is a `start` process whose node is its child `start --headless`: one node, counted once
    parents = {ppid for _, ppid in found}
    return sorted((n for n, _ in found if n.pid not in parents), key=lambda n: n.pid)


def _parent(entry: Path) -> int | None:
    try:        # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def threads_for(requested: int, cores: int | None = None, others: list[Neighbour] | None = None) -> tuple[int, str | None]:
    """(threads, note): ``model.threads`` as given, or for 0 ("all cores") this node's share of the
    cores when other nodes run here, with a one-line note saying so and what to set instead."""
    cores = cores or os.cpu_count() or 2
    if requested:
        return requested, None
    others = other_nodes() if others is None else others
    if not others:
        return cores, None
    share = max(1, cores // (len(others) + 1))
    pids = ", ".join(str(n.pid) for n in others[:3]) + (" …" if len(others) > 3 else "")
    return share, (f"{len(others)} other ftis-edge node(s) run on this machine (pid {pids}): model.threads = 0 "
                   f"would give each all {cores} cores; using {share} (set model.threads = {share} in each "
                   f"node file to silence this)")
