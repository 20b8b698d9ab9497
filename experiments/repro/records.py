"""A published run's records as docs/runs keeps them: plain, or gzip-compressed by
``publish.py --gzip`` (metrics.jsonl.gz, eval-*.json.gz: a swarm batch's three seeds of runs
would not fit docs/'s size limit as plain text). Readers ask for the record by its plain name.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from ftis_edge.metrics import parse_records

GZ = ".gz"


def read_bytes(path: Path) -> bytes | None:
    """PATH's bytes, or those of PATH.gz decompressed; None when neither is there."""
    if path.is_file():
        return path.read_bytes()
    packed = path.with_name(path.name + GZ)
    return gzip.decompress(packed.read_bytes()) if packed.is_file() else None


def exists(path: Path) -> bool:
    return path.is_file() or path.with_name(path.name + GZ).is_file()


def metrics(run_dir: Path) -> list[dict]:
    """The run's records in order (a torn or blank line is skipped, as the node's reader does)."""
    return parse_records(read_bytes(Path(run_dir) / "metrics.jsonl") or b"")


def eval_of(run_dir: Path, which: str) -> dict | None:
    """The run's eval-WHICH.json, or None."""
    data = read_bytes(Path(run_dir) / f"eval-{which}.json")
    return None if data is None else json.loads(data)


def write_gz(path: Path, data: bytes) -> Path:
    """PATH.gz holding DATA, byte-for-byte the same for the same data (no name, no time inside)."""
    target = path.with_name(path.name + GZ)
    target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return target
