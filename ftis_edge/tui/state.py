"""What the dashboard knows about a run: records folded into a history, plus a log tail.

Pure data, no Textual: the app polls the files, feeds ``RunState.ingest`` and redraws from
it. Records come from a file another process writes, so ``ingest`` accepts anything and
keeps only what makes sense (see docs/metrics.md for the record types).
"""
from __future__ import annotations

import os
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from ftis_edge.metrics import LOG_FILE, METRICS_FILE, LineTail
from ftis_edge.rundir import CONFIG_FILE
from ftis_edge.tui.format import as_number



class RunState:
    """The run as seen so far: the start record, one dict per round, the stop record."""

    def __init__(self) -> None:
        self.start: dict | None = None
        self.stop: dict | None = None
        self.rounds: list[dict] = []
        self.peers: dict[str, dict] = {}
        self.ignored = 0                 # records that were not objects or of an unknown type
        self._series: dict[str, tuple[list, list, int]] = {}   # key -> (xs, ys, rounds read)

    # ---- feeding -------------------------------------------------------------------------
    def ingest(self, records: list) -> bool:
        """Fold new records in; returns True when anything changed."""
        changed = False
        for rec in records:
            if not isinstance(rec, dict):
                self.ignored += 1
                continue
            kind = rec.get("type", "round")
            if kind == "start":
                self.start, self.stop = rec, None     # a later start means the node resumed
            elif kind == "stop":
                self.stop = rec
            elif kind == "round":
                self._add_round(rec)
            else:
                self.ignored += 1
                continue
            changed = True
        return changed

    def _add_round(self, rec: dict) -> None:
        rnd = as_number(rec.get("round"))
        if rnd is None:                   # tolerate a record without a usable round number
            rnd = (self.last_round or 0) + 1
        rnd = int(rnd)
        # A round number we have already seen means the node resumed from an earlier
        # checkpoint: the later record supersedes everything from that round on.
        while self.rounds and self.rounds[-1]["round"] >= rnd:
            self.rounds.pop()
            self._series.clear()
        self.rounds.append(dict(rec, round=rnd))
        peers = rec.get("peers")
        if isinstance(peers, dict):       # per-peer stats are cumulative: the latest is the truth
            self.peers = {str(k): v for k, v in peers.items() if isinstance(v, dict)}

    # ---- reading -------------------------------------------------------------------------
    @property
    def latest(self) -> dict:
        """The newest round record ({} before the first round)."""
        return self.rounds[-1] if self.rounds else {}

    @property
    def last_round(self) -> int | None:
        return self.rounds[-1]["round"] if self.rounds else None

    @property
    def finished(self) -> bool:
        return self.stop is not None

    def last(self, key: str) -> float | None:
        """The latest round's value of ``key`` (None when missing or not a number)."""
        return as_number(self.latest.get(key))

    def mean_last(self, key: str, n: int = 10) -> float | None:
        """Mean of ``key`` over the last ``n`` rounds, ignoring rounds where it is missing."""
        vals = [v for v in (as_number(r.get(key)) for r in self.rounds[-n:]) if v is not None]
        return sum(vals) / len(vals) if vals else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(rounds, values) of ``key``, skipping rounds where it is missing.

        Extended incrementally: a redraw after a new round reads one record, not the run."""
        xs, ys, done = self._series.get(key, ([], [], 0))
        for r in self.rounds[done:]:
            v = as_number(r.get(key))
            if v is not None:
                xs.append(r["round"])
                ys.append(v)
        self._series[key] = (xs, ys, len(self.rounds))
        return list(xs), list(ys)

    def identity(self, key: str):
        """A field of the start record (node_id, model, relay, ...), or None."""
        return (self.start or {}).get(key)

    def peer_counts(self) -> tuple[int, int]:
        """(active peers, quarantined peers)."""
        quarantined = sum(1 for p in self.peers.values() if p.get("quarantined") is True)
        return len(self.peers) - quarantined, quarantined

    def now(self) -> float | None:
        """Time of the newest record: peers' "last seen" ages are measured from it, so a
        finished run reads the same as it did live."""
        times = [as_number(r.get("time")) for r in (self.latest, self.stop or {})]
        times = [t for t in times if t is not None]
        return max(times) if times else None


class LogTail:
    """Follows a text file: ``poll()`` returns the complete lines appended since last time."""

    def __init__(self, path: str | os.PathLike, initial_bytes: int = 64 * 1024):
        self._tail = LineTail(path, initial_bytes)   # on attach, show only the tail of a long log

    def poll(self) -> list[str]:
        return [ln.decode("utf-8", errors="replace").rstrip("\r") for ln in self._tail.poll()]


def load_config(run_dir: str | os.PathLike, start: dict | None) -> tuple[dict, str]:
    """The node's config and where it came from: the start record, else config.toml."""
    if start and isinstance(start.get("config"), dict):
        return start["config"], "start record"
    path = Path(run_dir) / CONFIG_FILE
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), CONFIG_FILE
    except FileNotFoundError:
        return {}, "none yet"
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return {}, f"{CONFIG_FILE} unreadable: {exc}"


def flatten(config: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested tables as dotted keys: {"train": {"learning_rate": 1e-5}} → [("train.learning_rate", 1e-5)]."""
    out = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, name + ".")
        else:
            out.append((name, value))
    return out


def has_run_files(run_dir: str | os.PathLike) -> bool:
    """Whether a directory looks like a run directory (any of the files a node writes)."""
    d = Path(run_dir)
    return any((d / name).exists() for name in (METRICS_FILE, LOG_FILE, CONFIG_FILE))
