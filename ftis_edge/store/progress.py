"""What a node is doing right now: RUN_DIR/progress.json, one small JSON object replaced
atomically (phase, progress within the round, when the round started).

The node calls ``ProgressReport.phase`` when it enters a phase (written at once) and
``ProgressReport.step`` inside a phase (written at most every ``min_interval`` seconds), so
the hot loops pay a clock read and a comparison. Nothing here touches a random generator or
the training data: alone-mode runs stay bit-identical with or without a reader.

The dashboard reads it with ``read_progress``; a file another process writes is untrusted, so
the reader returns a dict or None and never raises. How long loading took is remembered per
model in the cache (``load_times.json``) so the next start-up can say what to expect.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson

from ..common import atomic

PROGRESS_FILE = "progress.json"
LOAD_TIMES_FILE = "load_times.json"

# The phases, in round order (what the dashboard names them).
LOADING, GENERATING, GRADING, WAITING, TRAINING, SYNCING, CHECKPOINTING, PAUSED, STOPPED = (
    "loading", "generating", "grading", "waiting for peers", "training", "syncing",
    "checkpointing", "paused", "stopped")
EVALUATING = "held-out eval"      # heldout.py: greedy answers to the held-out prompts


class ProgressReport:
    """Writes RUN_DIR/progress.json; never raises (a full disk must not stop training)."""

    def __init__(self, run_dir: str | os.PathLike, *, min_interval: float = 0.5, clock=time.time):
        self.path = Path(run_dir) / PROGRESS_FILE
        self.min_interval = min_interval
        self.clock = clock
        self.state: dict = {"pid": os.getpid()}
        self._written = 0.0
        self._lock = threading.RLock()      # the node's relay watcher writes from its own thread

    def round_started(self, rnd: int) -> None:
        with self._lock:
            self.state.update(round=rnd, round_started=self.clock())

    def phase(self, name: str, **detail) -> None:
        """Enter phase ``name`` (written now); ``detail`` replaces the previous phase's."""
        with self._lock:
            now = self.clock()
            keep = {k: self.state[k] for k in ("pid", "round", "round_started", "relay") if k in self.state}
            self.state = {**keep, "phase": name, "since": now, **detail}
            self._write(now)

    def advance(self, done: int, total: int, **detail) -> None:
        """Progress inside the phase: ``done`` of ``total`` (throttled)."""
        with self._lock:
            self.state.update(done=done, total=total, **detail)
            now = self.clock()
            if done >= total or now - self._written >= self.min_interval:
                self._write(now)

    def relay(self, health: dict) -> None:
        """The relay as the node's client sees it now ({state, reason, latency_ms}), written when
        it changed: the dashboard's relay cell is then as fresh as the node's own log, not a round old."""
        with self._lock:
            if self.state.get("relay") != health:
                self.state["relay"] = health
                self._write(self.clock())

    def _write(self, now: float) -> None:
        self.state["time"] = now
        self._written = now
        try:
            atomic.write_bytes(self.path, orjson.dumps(self.state))
        except (OSError, TypeError):
            pass


def read_progress(run_dir: str | os.PathLike) -> dict | None:
    """The node's latest progress.json, or None when missing or unreadable."""
    try:
        data = orjson.loads((Path(run_dir) / PROGRESS_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("phase"), str) else None


def load_key(spec: str, backend: str, trainable: str) -> str:
    return f"{spec}|{backend}|{trainable}"


def last_load_seconds(cache: Path, key: str) -> float | None:
    """How long loading ``key`` took last time on this machine (None: never loaded here)."""
    try:
        value = orjson.loads((cache / LOAD_TIMES_FILE).read_bytes()).get(key)
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def remember_load_seconds(cache: Path, key: str, seconds: float) -> None:
    try:
        try:
            times = orjson.loads((cache / LOAD_TIMES_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            times = {}
        if not isinstance(times, dict):
            times = {}
        times[key] = round(seconds, 1)
        atomic.write_bytes(cache / LOAD_TIMES_FILE, orjson.dumps(times))
    except OSError:
        pass
