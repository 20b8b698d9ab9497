"""Atomic checkpoints: write into a temporary directory, fsync, then rename (``atomic.write_dir``).

A SIGKILL at any moment leaves either the previous checkpoint or the new one, never half of
one. ``RUN_DIR/checkpoints/round-NNNNNN/state.pt`` holds learner weights + optimiser, the
round number and every RNG state; the newest complete one is the one with the highest round.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch

from . import atomic

KEEP = 2
_NAME = re.compile(r"^round-(\d{6})$")


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, round_: int, state: dict) -> Path:
    root = _dir(run_dir)
    final = atomic.write_dir(root / f"round-{round_:06d}", lambda tmp: torch.save(state, tmp / "state.pt"),
                             durable=True)
    for old in sorted(complete(run_dir))[:-KEEP]:
        shutil.rmtree(root / f"round-{old:06d}", ignore_errors=True)
    return final


def complete(run_dir: Path) -> list[int]:
    root = _dir(run_dir)
    if not root.exists():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir()
                  if (m := _NAME.match(p.name)) and (p / "state.pt").exists())


def load_latest(run_dir: Path) -> dict | None:
    rounds = complete(run_dir)
    if not rounds:
        return None
    path = _dir(run_dir) / f"round-{rounds[-1]:06d}" / "state.pt"
    return torch.load(path, map_location="cpu", weights_only=False)
