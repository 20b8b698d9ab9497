"""A full disk, named: "disk full" with the path and the space needed, checked before a write
that would otherwise die half-way ("OSError: 4608 requested and 0 written").

The node checks the room for its first checkpoint and weights before round 1 (so no round is lost
to a disk that could never hold them), and the room for each checkpoint before writing it (older
checkpoints make way; the newest one is always kept). Any other write that still meets a full
disk is reported the same way (``explain``).
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..errors import FtisError

MARGIN = 1 << 20             # logs, metrics, manifests, file-system overhead
# The command that works whether or not the run got as far as a checkpoint (--resume alone
# refuses a run without one, and a full disk often stops a node before its first).
AGAIN = "start again with --resume-or-fresh (it resumes from the newest checkpoint, or starts fresh when there is none)"


class DiskFull(FtisError):
    """Not enough free space where the run writes; the message says where and how much."""


def is_disk_full(exc: BaseException) -> bool:
    if not isinstance(exc, OSError):
        return False
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    text = str(exc)
    return "No space left" in text or ("requested and" in text and "written" in text)


def free_bytes(path) -> int:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def human(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def tensor_bytes(obj) -> int:
    """Bytes of the tensors and arrays in a nested state (what a checkpoint of it will take)."""
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.element_size() * obj.numel()
    return 0


def require(path, need: int, what: str, kept: str = "") -> None:
    """DiskFull unless ``path``'s file system has ``need`` bytes (plus a margin) free."""
    free = free_bytes(path)
    if free >= need + MARGIN:
        return
    raise DiskFull(f"disk full: {what} needs {human(need + MARGIN)} in {path}, only {human(free)} free"
                   f"{'; ' + kept if kept else ''}; free {human(need + MARGIN - free)} or more there (or set "
                   f"node.run_dir on a larger disk), then {AGAIN}")


def explain(exc: OSError, run_dir, need: int | None = None, kept: str = "") -> DiskFull:
    """A write that met a full disk, as DiskFull: where, how much is free, how much is needed."""
    where = getattr(exc, "filename", None) or run_dir
    free = free_bytes(run_dir)
    needs = f"; this run needs about {human(need + MARGIN)} there" if need else ""
    return DiskFull(f"disk full: writing {where} failed ({exc.strerror or exc}); {human(free)} free in {run_dir}"
                    f"{needs}{'; ' + kept if kept else ''}; free space there (or set node.run_dir on a larger "
                    f"disk), then {AGAIN}")
