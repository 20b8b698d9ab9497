"""Atomic, verified checkpoints that cannot run code: write into a temporary directory, fsync,
then rename (``atomic.write_dir``).

A SIGKILL at any moment leaves either the previous checkpoint or the new one, never half of
one. ``RUN_DIR/checkpoints/round-NNNNNN/`` holds ``state.safetensors`` (learner weights +
optimiser, the round number and every RNG state: ``statefile``, tensors plus JSON, no pickle)
and ``manifest.json`` (its size and sha256, written after it). Loading verifies the newest
checkpoint against its manifest (a checkpoint without one gets a load test instead) and falls
back to the newest good one, so a disk that truncated or emptied a file costs rounds, not the run.

Run directories get shared ("export my run for me"), and whoever writes a checkpoint writes
its manifest too, so the checksum proves nothing about intent: the only state file read is
``state.safetensors``, whose loader runs no code. Any other file in a checkpoint directory (a
``state.pt`` pickle, say) is never opened; a directory without the state file is no checkpoint.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from ..common import atomic
from . import statefile
from ..errors import FtisError

KEEP = 2
DIR = "checkpoints"                        # RUN_DIR/checkpoints/
STATE, MANIFEST = "state.safetensors", "manifest.json"
_NAME = re.compile(r"^round-(\d{6})$")

log = logging.getLogger(__name__)


class CheckpointError(FtisError):
    """No usable checkpoint where one is needed; the message says what was found."""


def dir_of(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoints``: where every checkpoint of a run lives."""
    return Path(run_dir) / DIR


def save(run_dir: Path, round_: int, state: dict, *, best: dict | None = None) -> Path:
    """``best``: the best held-out eval's weights this checkpoint goes with (``best_info``), named
    in its manifest so that what a checkpoint and the best weights are can be read side by side."""
    root = dir_of(run_dir)

    def write(tmp: Path) -> None:
        statefile.save(tmp / STATE, state)
        # the manifest is what load_round verifies the state against
        path = tmp / STATE
        manifest = {"round": round_, "file": STATE, "bytes": path.stat().st_size, "sha256": atomic.sha256_of(path)}
        if best:
            manifest["best"] = best
        (tmp / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")

    final = atomic.write_dir(root / f"round-{round_:06d}", write, durable=True)
    for old in complete(run_dir)[:-KEEP]:
        shutil.rmtree(root / f"round-{old:06d}", ignore_errors=True)
    return final


def make_room(run_dir: Path, need: int, free_bytes) -> None:
    """Before a save on a filling disk: remove older checkpoints, never the newest, until
    ``free_bytes(dir)`` reaches ``need`` (``save`` keeps KEEP and would remove them afterwards)."""
    root = dir_of(run_dir)
    for old in complete(run_dir)[:-1]:
        if free_bytes(root) >= need:
            return
        log.warning("disk nearly full: removing the checkpoint of round %d to make room for the next one", old)
        shutil.rmtree(root / f"round-{old:06d}", ignore_errors=True)


def complete(run_dir: Path) -> list[int]:
    """Rounds that have a checkpoint directory with a state file (verified or not), oldest first."""
    root = dir_of(run_dir)
    if not root.exists():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir()
                  if (m := _NAME.match(p.name)) and _state_file(p) is not None)


def _state_file(ckpt: Path) -> Path | None:
    return ckpt / STATE if atomic.is_regular(ckpt / STATE) else None     # a FIFO would block its reader


def _load(path: Path) -> dict:
    state = statefile.load(path)
    if not isinstance(state, dict) or "round" not in state:
        raise ValueError("not a checkpoint state (no round)")
    for key in ("learner", "trainable"):        # what a resume or an export hands to torch as a state dict
        if key in state and not isinstance(state[key], dict):
            raise ValueError(f"its {key!r} entry is a {type(state[key]).__name__}, not a state dict")
    return state


def load_round(run_dir: Path, round_: int) -> dict:
    """The checkpoint of ``round_``, verified; raises CheckpointError saying what is wrong."""
    ckpt = dir_of(run_dir) / f"round-{round_:06d}"
    path = _state_file(ckpt)
    if path is None:
        raise CheckpointError(f"{ckpt.name}: no {STATE}")
    name, size = path.name, path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{ckpt.name}: {name} is empty")
    if (ckpt / MANIFEST).exists() and not atomic.is_regular(ckpt / MANIFEST):
        raise CheckpointError(f"{ckpt.name}: {MANIFEST} is not a regular file")
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        manifest = None                       # written before manifests: the load test decides
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt.name}: unreadable {MANIFEST} ({e})") from None
    if manifest is not None:
        if manifest.get("file") != name:
            raise CheckpointError(f"{ckpt.name}: {MANIFEST} describes {manifest.get('file')}, not {name}")
        if size != manifest.get("bytes"):
            raise CheckpointError(f"{ckpt.name}: {name} has {size} bytes, {manifest.get('bytes')} were written "
                                  f"(truncated?)")
        if atomic.sha256_of(path) != manifest.get("sha256"):
            raise CheckpointError(f"{ckpt.name}: {name} does not match its checksum (corrupted)")
    try:
        state = _load(path)
    except Exception as e:      # StateFileError and what safetensors raises for a damaged file
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"{ckpt.name}: {name} does not load ({type(e).__name__}: {reason})") from None
    if state["round"] != round_:
        raise CheckpointError(f"{ckpt.name}: holds round {state['round']}")
    return state


def into_learner(learner, state: dict, run_dir: Path) -> None:
    """Load a checkpoint's learner state into ``learner``; one that does not fit (another model,
    LoRA rank or targets, trainable mode: the config changed under the run) is a CheckpointError
    in words, not torch's size mismatch."""
    from ..errors import one_line
    try:
        learner.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"the checkpoint in {dir_of(run_dir).resolve()} does not fit the model and settings "
                              f"in {(Path(run_dir) / 'config.toml').resolve()} ({one_line(e, 200)}): put back the "
                              f"settings the run was made with (model, train.trainable, train.lora_*)") from None


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
            problems.append((f"round-{r:06d}", str(e)))
            continue
        for name, why in problems:     # said only when falling back: else the error below says it once
            log.warning("checkpoint %s is unusable: %s", name, why)
        if problems:
            log.warning("resuming from the older checkpoint of round %d (%d newer one%s unusable)",
                        r, len(problems), "" if len(problems) == 1 else "s")
        return state
    raise CheckpointError(f"no usable checkpoint in {dir_of(run_dir)}: " + "; ".join(why for _, why in problems))


# --- the best held-out eval's weights ------------------------------------------------------------
# checkpoints/best-NNNNNN/: the trainable weights (LoRA matrices, or all weights for full
# fine-tuning) of the round whose held-out eval was the best so far, with a manifest (size,
# sha256, round, accuracy). A new best is written beside the old one, then the old one removed:
# a kill at any moment leaves at least one complete best.
_BEST = re.compile(r"^best-(\d{6})$")


def save_best(run_dir: Path, round_: int, weights: dict, info: dict) -> Path:
    """Keep ``weights`` (name -> tensor) as the best so far; ``info`` (accuracy, n, interval ...)
    goes into the manifest and the state."""
    root = dir_of(run_dir)

    def write(tmp: Path) -> None:
        statefile.save(tmp / STATE, {"round": round_, "best": info, "trainable": weights})
        path = tmp / STATE
        (tmp / MANIFEST).write_text(json.dumps({"round": round_, "file": STATE, "bytes": path.stat().st_size,
                                                "sha256": atomic.sha256_of(path), "best": info}),
                                    encoding="utf-8")

    final = atomic.write_dir(root / f"best-{round_:06d}", write, durable=True)
    for p in root.iterdir():
        if (m := _BEST.match(p.name)) and int(m.group(1)) != round_:
            shutil.rmtree(p, ignore_errors=True)
    return final


def best_info(run_dir: Path) -> dict | None:
    """The newest best weights' manifest (round, accuracy, ...), or None; not verified."""
    root = dir_of(run_dir)
    if not root.is_dir():
        return None
    rounds = sorted(int(m.group(1)) for p in root.iterdir() if (m := _BEST.match(p.name)))
    for r in reversed(rounds):
        if not atomic.is_regular(root / f"best-{r:06d}" / MANIFEST):
            continue
        try:
            manifest = json.loads((root / f"best-{r:06d}" / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("round") == r:
            return manifest
    return None


def load_best(run_dir: Path) -> dict | None:
    """The best weights' state ({"round", "best", "trainable"}), verified against its manifest;
    None when the run kept none; CheckpointError when they are damaged or not what a node writes.

    Run directories get shared: the cheap checks come first (the file's size against the newest
    checkpoint's, which holds the same weights and more, then its safetensors header), the hash
    after them, and every field that is printed is checked to be what the node writes."""
    manifest = best_info(run_dir)
    if manifest is None:
        return None
    ckpt = dir_of(run_dir) / f"best-{manifest['round']:06d}"
    path = ckpt / STATE
    if not atomic.is_regular(path) or path.stat().st_size != manifest.get("bytes"):
        raise CheckpointError(f"{ckpt.name}: {STATE} is missing or has another size than was written (truncated?)")
    size, bound = path.stat().st_size, _largest_checkpoint(run_dir)
    if bound is not None and size > bound + BEST_SLACK:
        raise CheckpointError(f"{ckpt.name}: {STATE} has {size} bytes, more than the newest checkpoint's {bound} "
                              f"(which holds these weights and the optimiser's): not weights this run kept")
    try:
        statefile.check_header(path)
    except statefile.StateFileError as e:
        raise CheckpointError(f"{ckpt.name}: {STATE} is not a state file ({e})") from None
    if atomic.sha256_of(path) != manifest.get("sha256"):
        raise CheckpointError(f"{ckpt.name}: {STATE} does not match its checksum (corrupted)")
    try:
        state = statefile.load(path)
    except Exception as e:      # StateFileError and what safetensors raises for a damaged file
        raise CheckpointError(f"{ckpt.name}: {STATE} does not load ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("trainable"), dict):
        raise CheckpointError(f"{ckpt.name}: not a best-weights state")
    problem = _best_problem(state, manifest["round"])
    if problem:
        raise CheckpointError(f"{ckpt.name}: not a best-weights state the node writes ({problem})")
    return state


BEST_SLACK = 2**20       # the best state's own small table (accuracy, interval ...) beside its weights


def _largest_checkpoint(run_dir: Path) -> int | None:
    sizes = [p.stat().st_size for r in complete(run_dir) if (p := _state_file(dir_of(run_dir) / f"round-{r:06d}"))]
    return max(sizes) if sizes else None


def _fraction(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0


def _best_problem(state: dict, round_: int) -> str | None:
    """What is wrong with a best-weights state's fields (None: nothing). Its numbers get printed
    and its tensors exported, so each must be what ``save_best`` writes: no text, no odd types."""
    import torch
    if state.get("round") != round_ or isinstance(state.get("round"), bool):
        return f"its round is not {round_}"
    info = state.get("best")
    if not isinstance(info, dict):
        return f"its 'best' entry is a {type(info).__name__}, not a table"
    if not _fraction(info.get("accuracy")):
        return "its accuracy is not a number between 0 and 1"
    if not isinstance(info.get("n"), int) or isinstance(info.get("n"), bool) or info["n"] < 1:
        return "its prompt count is not a positive whole number"
    interval = info.get("interval")
    if interval is not None and not (isinstance(interval, (list, tuple)) and len(interval) == 2
                                     and all(_fraction(v) for v in interval)):
        return "its interval is not two numbers between 0 and 1"
    if info.get("base_accuracy") is not None and not _fraction(info["base_accuracy"]):
        return "its base accuracy is not a number between 0 and 1"
    bad = [k for k, v in state["trainable"].items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        return f"{len(bad)} of its weights are not named tensors"
    return None


def clear(run_dir: Path) -> None:
    """Remove every checkpoint (a fresh start must never resume from an older run's)."""
    shutil.rmtree(dir_of(run_dir), ignore_errors=True)
