"""One live node per run directory: RUN_DIR/node.lock, held with flock for the node's lifetime.

The kernel drops the lock when the process ends, however it ends (kill -9, power loss of the
terminal, a crash), so there is no stale lock to clean up. flock works on Linux, WSL2 and macOS
(the platforms the README names); on a system without fcntl the check is skipped, never fatal.
Readers (``ftis-edge watch``, export of a finished run) never take it: it only keeps a second
node — a fresh start, ``--resume``, ``--resume-or-fresh`` or ``--overwrite`` — out of a live run.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .errors import FtisError

try:
    import fcntl
except ImportError:            # pragma: no cover - Windows outside WSL2
    fcntl = None

LOCK_FILE = "node.lock"
_held: dict = {}                 # run dir (resolved) -> this process's open lock file (the lock lives while it is open)


class RunLocked(FtisError):
    """Another live node owns the run directory."""


def holder(run_dir) -> dict | None:
    """Who holds the run directory's lock now ({pid, started, ...}), or None when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return None
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _read(path)
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def refusal(run_dir, info: dict, program: str = "ftis-edge") -> str:
    pid = info.get("pid")
    who = f"node pid {pid}" if pid else "another node"
    started = f" (started {info['started']})" if info.get("started") else ""
    stop = (f"stop it with q in its dashboard or `kill -INT {pid}` (it stops after its round, with a checkpoint)"
            if pid else "stop it first")
    return (f"{who} is running in {run_dir}{started}: watch it with {program} watch {run_dir}; {stop}; "
            f"a second node needs another --run-dir")


def acquire(run_dir, program: str = "ftis-edge") -> bool:
    """Take the run directory for this process (until it exits or ``release``); RunLocked when a
    live node has it. False when this process holds it already (the CLI took it, then its Node
    asks again): a second flock of our own would refuse us."""
    if fcntl is None:
        return False
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if run_dir.resolve() in _held:
        return False
    fh = open(run_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        info = _read(run_dir / LOCK_FILE)
        fh.close()
        raise RunLocked(refusal(run_dir, info, program)) from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                         "host": os.uname().nodename if hasattr(os, "uname") else ""}))
    fh.flush()
    _held[run_dir.resolve()] = fh
    return True


def check_free(run_dir, program: str = "ftis-edge") -> None:
    """RunLocked when a live node holds the run directory (for a dashboard, before it starts one)."""
    info = holder(run_dir)
    if info is not None:
        raise RunLocked(refusal(run_dir, info, program))


def release(run_dir=None) -> None:
    """Give up this process's lock on ``run_dir`` (a Node that took it, at its end), or all of
    them (a dashboard, handing its run to the node it starts)."""
    for key in list(_held) if run_dir is None else [Path(run_dir).resolve()]:
        fh = _held.pop(key, None)
        if fh is not None:
            fh.close()
