"""Where things live on disk: the cache, the project root, the shared data folder."""
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


def shared_data_dir() -> Path | None:
    """The offline datasets folder: $FTIS_SHARED/data, else ../shared/data beside the project."""
    candidates = []
    if os.environ.get("FTIS_SHARED"):
        candidates.append(Path(os.environ["FTIS_SHARED"]) / "data")
    candidates.append(PROJECT_ROOT.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None
