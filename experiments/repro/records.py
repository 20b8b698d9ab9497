"""A published run's records as docs/runs keeps them: plain, or gzip-compressed by
``publish.py --gzip`` (metrics.jsonl.gz, eval-*.json.gz: a swarm batch's three seeds of runs
would not fit docs/'s size limit as plain text). Readers ask for the record by its plain name.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from ftis_edge.metrics.records import parse_records, round_records

GZ = ".gz"


def located(path: Path) -> Path | None:
    """The file that holds record PATH: PATH itself, else PATH.gz; None when neither is there."""
    for candidate in (path, path.with_name(path.name + GZ)):
        if candidate.is_file():
            return candidate
    return None


def read_bytes(path: Path) -> bytes | None:
    """Record PATH's bytes (decompressed when it is kept as PATH.gz); None when it is not there."""
    found = located(path)
    if found is None:
        return None
    data = found.read_bytes()
    return gzip.decompress(data) if found.name.endswith(GZ) else data


def exists(path: Path) -> bool:
    return located(path) is not None


def metrics(run_dir: Path) -> list[dict]:
    """The run's records in order (a torn or blank line is skipped, as the node's reader does)."""
    return parse_records(read_bytes(Path(run_dir) / "metrics.jsonl") or b"")


def rounds(run_dir: Path) -> list[dict]:
    """The run's round records, in order (its start and stop records left out)."""
    return round_records(metrics(run_dir))


def eval_of(run_dir: Path, which: str) -> dict | None:
    """The run's eval-WHICH.json, or None."""
    data = read_bytes(Path(run_dir) / f"eval-{which}.json")
    return None if data is None else json.loads(data)


def write_gz(path: Path, data: bytes) -> Path:
    """PATH.gz holding DATA, byte-for-byte the same for the same data (no name, no time inside)."""
    target = path.with_name(path.name + GZ)
    target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return target
