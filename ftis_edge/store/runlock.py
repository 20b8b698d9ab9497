"""One live node per run directory: RUN_DIR/node.lock, held with flock for the node's lifetime.

The kernel drops the lock when the process ends, however it ends (kill -9, power loss of the
terminal, a crash), so there is no stale lock to clean up. flock works on Linux, WSL2 and macOS
(the platforms the README names); on a system without fcntl the check is skipped, never fatal.
Readers (``ftis-edge watch``, export of a finished run) never take it: it only keeps a second
node — a fresh start, ``--resume``, ``--resume-or-fresh`` or ``--overwrite`` — out of a live run.
A run directory may be someone else's: a node.lock that is a symlink, a FIFO or a hard link is
refused with a one-line error (LockFileError), never followed, truncated or rewritten.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path

from ..errors import FtisError

try:
    import fcntl
except ImportError:            # pragma: no cover - Windows outside WSL2
    fcntl = None

LOCK_FILE = "node.lock"
_held: dict = {}                 # run dir (resolved) -> this process's open lock file (the lock lives while it is open)


class RunLocked(FtisError):
    """Another live node owns the run directory."""


class LockFileError(FtisError):
    """RUN_DIR/node.lock is something a lock must not be opened through (a link, a FIFO, …)."""


class RunDirNotWritable(FtisError):
    """The run directory cannot be written (a read-only file system, no permission)."""


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _not_writable(run_dir: Path, e: OSError) -> RunDirNotWritable:
    return RunDirNotWritable(
        f"cannot write the run directory {run_dir} ({e.strerror or e}): a node keeps its checkpoints and metrics "
        f"there; give it a writable folder with --run-dir DIR (a read-only run can still be watched, "
        f"evaluated with eval --model RUN_DIR, and exported with export RUN_DIR --to DIR)")


# O_NOFOLLOW: a node.lock that is a symlink to someone's file is refused, never truncated and
# rewritten; O_NONBLOCK: a FIFO there cannot hang the open (it is then refused as not a file).
_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open(path: Path, create: bool):
    """The lock file opened read-write without following a link, or None when it is absent and
    ``create`` is false; LockFileError when it is not a plain file of its own."""
    try:
        fd = os.open(path, _FLAGS | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as e:
        if e.errno in _UNWRITABLE and create and not path.is_symlink():
            raise _not_writable(path.parent, e) from None
        if path.is_symlink():
            raise LockFileError(f"{path} is a symbolic link: ftis-edge does not follow it (it would "
                                f"overwrite the file it points to); remove it and start again") from None
        raise LockFileError(f"{path}: cannot open the run lock ({e.strerror or e})") from None
    st = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
               else "has other names (hard links): it may be someone else's file" if st.st_nlink > 1 else None)
    if problem:
        os.close(fd)
        raise LockFileError(f"{path} {problem}; ftis-edge will not use it as the run lock: remove it and start again")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+", encoding="utf-8")


def holder(run_dir) -> dict | None:
    """Who holds the run directory's lock now ({pid, started, ...}), or None when nobody does.
    LockFileError when node.lock is there but is no plain file."""
    if fcntl is None:
        return None
    fh = _open(Path(run_dir) / LOCK_FILE, create=False)
    if fh is None:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _read(fh)
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None


def _read(fh) -> dict:
    """The holder's note, read through our own descriptor (never the path again)."""
    try:
        fh.seek(0)
        info = json.loads(fh.read(4096) or "{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(info, dict):
        return {}
    # Written by whoever made the file: only a pid and printable short strings reach a message.
    pid = info.get("pid")
    out = {"pid": pid} if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else {}
    for key in ("started", "host"):
        v = info.get(key)
        if isinstance(v, str) and len(v) <= 64 and v.isprintable():
            out[key] = v
    return out


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
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in _UNWRITABLE:
            raise _not_writable(run_dir, e) from None
        raise
    if run_dir.resolve() in _held:
        return False
    fh = _open(run_dir / LOCK_FILE, create=True)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        info = _read(fh)
        fh.close()
        raise RunLocked(refusal(run_dir, info, program)) from None
    fh.seek(0)
    fh.truncate()               # ours now: the previous holder's note goes
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
