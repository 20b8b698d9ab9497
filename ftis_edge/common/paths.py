"""Where things live on disk: the cache, the project root, the offline data folder."""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Root of ftis-edge's caches (converted weights, F16 exports, built wheels)."""
    base = os.environ.get("FTIS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ftis-edge")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def user_data_dir() -> Path:
    """Where ``./install.sh --data`` (``python -m ftis_edge.tasks.fetch``) puts GSM8K and MATH-500."""
    return cache_dir() / "data"


def shared_data_dir() -> Path | None:
    """The offline datasets folder (``gsm8k/*.jsonl``, ``math500/test.jsonl``):
    ``$FTIS_SHARED/data`` when set (CI), else the one ``./install.sh --data`` fills."""
    candidates = []
    if os.environ.get("FTIS_SHARED"):
        candidates.append(Path(os.environ["FTIS_SHARED"]) / "data")
    candidates.append(user_data_dir())
    for c in candidates:
        if c.is_dir() and any(c.iterdir()):
            return c
    return None
