"""The per-round record: one JSON line per round in ``RUN_DIR/metrics.jsonl``.

Writers append whole lines (one ``write`` + flush), so a reader following the file never
sees half a record except at the very end, which ``LineTail`` holds back until its newline
arrives. Every key is registered in ``metric_keys`` (TRL's names where TRL has the quantity);
the full list is docs/metrics.md, generated from it.

Files of a run directory:
  config.toml      the node's resolved config
  metrics.jsonl    {"type": "round", ...} one per round; {"type": "start"|"stop", ...} markers
  node.log         human-readable log lines
  control.json     written by the TUI: {"pause": bool, "stop": bool}
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Iterable

import orjson

from ..common import atomic

METRICS_FILE = "metrics.jsonl"
LOG_FILE = "node.log"
CONTROL_FILE = "control.json"


def _clean(value):
    """JSON has no NaN/inf: store them as null so every reader can parse the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab")

    def write(self, record: dict) -> None:
        record = dict(record)
        record.setdefault("type", "round")
        record.setdefault("time", time.time())
        self._fh.write(orjson.dumps(_clean(record), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All complete records of a run (a torn last line is ignored)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return parse_records(path.read_bytes())


def round_records(records: Iterable[dict]) -> list[dict]:
    """The round records among a run's records, in order (its start and stop markers left out)."""
    return [r for r in records if r.get("type") == "round"]


def read_rounds(run_dir: str | os.PathLike) -> list[dict]:
    """The run's round records, in order: what a report, a benchmark or a test reads of a run."""
    return round_records(read_metrics(run_dir))


def parse_records(data: bytes) -> list[dict]:
    """A metrics.jsonl's bytes as records (also an archived copy's, experiments/repro/records.py)."""
    return _records(data.split(b"\n"))


def _records(lines: list[bytes]) -> list[dict]:
    """The parsed lines; blank and unparsable ones (a torn last line) are skipped."""
    out = []
    for line in lines:
        if line.strip():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return out


class LineTail:
    """Follows a growing file: ``poll()`` returns the complete lines appended since last time.

    A line is held back until its newline arrives (a writer may be mid-write). With
    ``initial_bytes`` the first poll starts that far from the end (a long log), dropping the
    partial line it lands in. A file that shrinks was replaced: reading starts over.
    """

    def __init__(self, path: str | os.PathLike, initial_bytes: int | None = None):
        self.path = Path(path)
        self.initial_bytes = initial_bytes
        self._offset: int | None = None if initial_bytes is not None else 0
        self._partial = b""

    def poll(self) -> list[bytes]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        skip_first = False
        if self._offset is None:
            self._offset = max(0, size - self.initial_bytes)
            skip_first = self._offset > 0          # we landed mid-line
        if size < self._offset:                    # truncated or replaced: start over
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read(size - self._offset)
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()                # incomplete until its newline arrives
        return lines[1:] if skip_first else lines


class MetricsFollower:
    """Incremental reader: ``poll()`` returns the records appended since the last call."""

    def __init__(self, run_dir: str | os.PathLike):
        self._tail = LineTail(Path(run_dir) / METRICS_FILE)

    def poll(self) -> list[dict]:
        return _records(self._tail.poll())


def write_control(run_dir: str | os.PathLike, *, pause: bool | None = None,
                  stop: bool | None = None) -> dict:
    """Update the node's control file atomically (write + rename); returns the new state."""
    state = read_control(run_dir)
    if pause is not None:
        state["pause"] = pause
    if stop is not None:
        state["stop"] = stop
    atomic.write_bytes(Path(run_dir) / CONTROL_FILE, orjson.dumps(state))
    return state


def read_control(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / CONTROL_FILE
    try:
        state = orjson.loads(path.read_bytes())
        if isinstance(state, dict):
            return {"pause": bool(state.get("pause")), "stop": bool(state.get("stop"))}
    except (FileNotFoundError, orjson.JSONDecodeError):
        pass
    return {"pause": False, "stop": False}
