"""Atomic, verified checkpoints: write into a temporary directory, fsync, then rename
(``atomic.write_dir``).

A SIGKILL at any moment leaves either the previous checkpoint or the new one, never half of
one. ``RUN_DIR/checkpoints/round-NNNNNN/`` holds ``state.pt`` (learner weights + optimiser,
the round number and every RNG state) and ``manifest.json`` (its size and sha256, written
after it). Loading verifies the newest checkpoint against its manifest (a checkpoint written
before manifests existed gets a load test instead) and falls back to the newest good one,
so a disk that truncated or emptied a file costs rounds, not the run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

from . import atomic
from .errors import FtisError

KEEP = 2
STATE, MANIFEST = "state.pt", "manifest.json"
_NAME = re.compile(r"^round-(\d{6})$")

log = logging.getLogger(__name__)


class CheckpointError(FtisError):
    """No usable checkpoint where one is needed; the message says what was found."""


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


class _HashingWriter:
    """A file that hashes what torch.save writes through it (no second read of a large file)."""

    def __init__(self, fh):
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def save(run_dir: Path, round_: int, state: dict) -> Path:
    root = _dir(run_dir)

    def write(tmp: Path) -> None:
        import torch      # here, not at import: the CLI and dashboard import this module
        with open(tmp / STATE, "wb") as fh:
            out = _HashingWriter(fh)
            torch.save(state, out)
        # the manifest is what load_round verifies the state against
        (tmp / MANIFEST).write_text(json.dumps({"round": round_, "bytes": out.size,
                                                "sha256": out.sha.hexdigest()}), encoding="utf-8")

    final = atomic.write_dir(root / f"round-{round_:06d}", write, durable=True)
    for old in complete(run_dir)[:-KEEP]:
        shutil.rmtree(root / f"round-{old:06d}", ignore_errors=True)
    return final


def complete(run_dir: Path) -> list[int]:
    """Rounds that have a checkpoint directory with a state file (verified or not), oldest first."""
    root = _dir(run_dir)
    if not root.exists():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir()
                  if (m := _NAME.match(p.name)) and (p / STATE).exists())


def _load(path: Path) -> dict:
    import torch
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or "round" not in state:
        raise ValueError("not a checkpoint state (no round)")
    return state


def load_round(run_dir: Path, round_: int) -> dict:
    """The checkpoint of ``round_``, verified; raises CheckpointError saying what is wrong."""
    ckpt = _dir(run_dir) / f"round-{round_:06d}"
    path = ckpt / STATE
    size = path.stat().st_size if path.exists() else None
    if size is None:
        raise CheckpointError(f"{ckpt.name}: no {STATE}")
    if size == 0:
        raise CheckpointError(f"{ckpt.name}: {STATE} is empty")
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        manifest = None                       # written before manifests: the load test decides
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt.name}: unreadable {MANIFEST} ({e})") from None
    if manifest is not None:
        if size != manifest.get("bytes"):
            raise CheckpointError(f"{ckpt.name}: {STATE} has {size} bytes, {manifest.get('bytes')} were written "
                                  f"(truncated?)")
        if atomic.sha256_of(path) != manifest.get("sha256"):
            raise CheckpointError(f"{ckpt.name}: {STATE} does not match its checksum (corrupted)")
    try:
        state = _load(path)
    except Exception as e:                    # torch raises RuntimeError, EOFError, UnpicklingError ...
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"{ckpt.name}: {STATE} does not load ({type(e).__name__}: {reason})") from None
    if state["round"] != round_:
        raise CheckpointError(f"{ckpt.name}: holds round {state['round']}")
    return state


def load_latest(run_dir: Path) -> dict | None:
    """The newest checkpoint that verifies, or None when the run directory has none at all.

    A bad newer checkpoint is skipped with a warning; when every one is bad, CheckpointError
    lists why each failed."""
    rounds = complete(run_dir)
    if not rounds:
        return None
    problems = []
    for r in reversed(rounds):
        try:
            state = load_round(run_dir, r)
        except CheckpointError as e:
            log.warning("checkpoint %s is unusable: %s", f"round-{r:06d}", e)
            problems.append(str(e))
            continue
        if problems:
            log.warning("resuming from the older checkpoint of round %d (%d newer one%s unusable)",
                        r, len(problems), "" if len(problems) == 1 else "s")
        return state
    raise CheckpointError(f"no usable checkpoint in {_dir(run_dir)}: " + "; ".join(problems))


def clear(run_dir: Path) -> None:
    """Remove every checkpoint (a fresh start must never resume from an older run's)."""
    shutil.rmtree(_dir(run_dir), ignore_errors=True)
