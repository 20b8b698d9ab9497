"""What the dashboard knows about a run: records folded into a history, plus a log tail.

Pure data, no Textual: the app polls the files, feeds ``RunState.ingest`` and redraws from
it. Records come from a file another process writes, so ``ingest`` accepts anything and
keeps only what makes sense (see docs/metrics.md for the record types).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from ftis_edge.store import progress as phases
from ftis_edge.metrics.best import BASE_ROUND, too_few
from ftis_edge.metrics.best import from_records as best_from_records
from ftis_edge.metrics.records import LOG_FILE, METRICS_FILE, LineTail
from ftis_edge.store.rundir import CONFIG_FILE
from ftis_edge.tui import format as fmt
from ftis_edge.tui.format import as_number



class RunState:
    """The run as seen so far: the start record, one dict per round, the stop record."""

    def __init__(self) -> None:
        self.start: dict | None = None
        self.stop: dict | None = None
        self.rounds: list[dict] = []
        self.base_eval: dict | None = None     # the base model's held-out eval, as soon as it exists
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
            elif kind == "base_eval":
                self.base_eval = rec
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


@dataclass(frozen=True)
class HeldOut:
    """The held-out evals of the run as the records hold them (heldout.py): the newest eval with
    its Wilson interval, the base model's (round 0), the best, and the swarm guard's last word."""
    accuracy: float | None
    lo: float | None
    hi: float | None
    round: int | None
    base: float | None
    best: float | None
    best_round: int | None
    guard: str | None
    guard_level: int
    n: int | None = None        # held-out prompts

    @property
    def beat_base(self) -> bool:
        return self.best_round is not None and self.best_round != BASE_ROUND

    @property
    def too_few(self) -> bool:
        return too_few(self.n)

    @property
    def cell(self) -> str:
        """The strip: "61% (base 52%)"; "base 52%" before the first eval of trained weights."""
        if self.accuracy is None:
            return f"base {100 * self.base:.0f}%" if self.base is not None else fmt.MISSING
        out = f"{100 * self.accuracy:.0f}%"
        return out + (f" (base {100 * self.base:.0f}%)" if self.base is not None and self.round else "")


def held_out(state: RunState) -> HeldOut:
    """The newest eval in the records (an old run without evals: all None), the base model's as
    soon as its base_eval record exists, and the best by the one rule (ftis_edge.metrics.best)."""
    latest: dict = {}
    for rec in reversed(state.rounds):
        if as_number(rec.get("eval/accuracy")) is not None:
            latest = rec
            break
    early = [state.base_eval] if state.base_eval else []
    best = best_from_records(early + state.rounds)
    base = best.base if best is not None else None
    guard = next((r.get("swarm/guard") for r in reversed(state.rounds) if isinstance(r.get("swarm/guard"), str)),
                 None)
    rnd = as_number(latest.get("eval/round"))
    n = as_number(latest.get("eval/n") if latest else (state.base_eval or {}).get("eval/n"))
    has_best = best is not None and latest
    return HeldOut(as_number(latest.get("eval/accuracy")), as_number(latest.get("eval/accuracy_lo")),
                   as_number(latest.get("eval/accuracy_hi")), int(rnd) if rnd is not None else None, base,
                   best.accuracy if has_best else None, best.round if has_best else None,
                   fmt.text(guard, 200) if guard else None, int(as_number(state.latest.get("swarm/guard_level")) or 0),
                   int(n) if n is not None else None)


def held_out_points(state: RunState, key: str = "eval/accuracy", base_key: str = "eval/base_accuracy"
                    ) -> tuple[list[int], list[float]]:
    """(rounds, values) of a held-out series, the base model's eval at round 0 first."""
    xs, ys = state.series(key)
    _, base = state.series(base_key)
    if base:
        xs, ys = [0] + xs, [base[0]] + ys
    return xs, ys


@dataclass(frozen=True)
class RelayHealth:
    """The relay as the node last recorded it, read once (header, headline, Peers tab).

    state: "off" (no relay configured), "connected", "unreachable", "refused", or None (not
    known yet); reason: why it is not connected; latency_ms when connected."""
    state: str | None
    reason: str | None = None
    latency_ms: float | None = None

    @property
    def problem(self) -> str | None:
        """e.g. "unreachable (connection refused)" when the relay is not connected, else None."""
        if self.state in (None, "off", "connected"):
            return None
        return f"{self.state} ({self.reason})" if self.reason else self.state

    @property
    def short(self) -> str:
        """The headline cell: "ok 38ms", "down", "off", "–"."""
        if self.state == "connected":
            return "ok" if self.latency_ms is None else f"ok {self.latency_ms:.0f}ms"
        if self.state is None or self.state == "off":
            return self.state or fmt.MISSING
        return "down"

    @property
    def sentence(self) -> str:
        """The Peers tab's word: "connected", "unreachable (…)", "no relay", "–"."""
        if self.state == "off":
            return "no relay"
        return self.problem or self.state or fmt.MISSING


def relay_health(state: RunState, progress: dict | None = None) -> RelayHealth:
    """The one reading of the relay's health: what the node's client says now (progress.json's
    ``relay``, updated within a second of a change), else the round record's ``relay/state`` and
    ``relay/reason`` (a round old: minutes on a slow node), else its ``relay/connected`` flag."""
    if state.start is not None and "relay" in state.start and state.start["relay"] is None:
        return RelayHealth("off")
    now = (progress or {}).get("relay")
    latest = state.latest
    if isinstance(now, dict) and isinstance(now.get("state"), str) and now["state"]:
        latest = {"relay/state": now["state"], "relay/reason": now.get("reason"),
                  "relay/latency_ms": now.get("latency_ms")}
    word, reason = latest.get("relay/state"), latest.get("relay/reason")
    if not isinstance(word, str) or not word:
        connected = latest.get("relay/connected")
        word = {True: "connected", False: "unreachable"}.get(connected) if isinstance(connected, bool) else None
    return RelayHealth(fmt.text(word, 24) if word else None,
                       fmt.text(reason, 80) if isinstance(reason, str) and reason else None,
                       as_number(latest.get("relay/latency_ms")) if word == "connected" else None)


# ---- what the node is doing now (RUN_DIR/progress.json) ------------------------------------
def progress_is_current(progress: dict | None, state: RunState) -> bool:
    """Whether progress.json tells about the run the records show: written after their start
    and stop records (a file the previous run of the directory left is older than the
    resumed run's records; a node that stopped wrote its "stopped" after its stop record)."""
    if not progress:
        return False
    written = as_number(progress.get("time"))
    marks = [t for t in (as_number((rec or {}).get("time")) for rec in (state.start, state.stop)) if t is not None]
    return written is not None and (not marks or written >= max(marks) - 1.0)


def phase_text(progress: dict, now: float) -> str:
    """The phase as a short sentence: "generating 12/32 completions · 410 tok/s"."""
    name = fmt.text(progress.get("phase"), 24)
    done, total = as_number(progress.get("done")), as_number(progress.get("total"))
    since = as_number(progress.get("since"))
    if name == phases.LOADING:
        out = f"loading {fmt.text(progress.get('what'), 48)}"
        if since is not None:
            out += f" · {fmt.age(now - since)}"
        last = as_number(progress.get("last_s"))
        return out + (f" (took {fmt.age(last)} last time)" if last is not None else " (first load here)")
    if name == phases.GENERATING:
        out = f"generating {fmt.integer(done)}/{fmt.integer(total)} completions"
        tok_s = as_number(progress.get("tok_s"))
        return out + (f" · {tok_s:.0f} tok/s" if tok_s is not None else "")
    if name == phases.GRADING:
        return f"grading {fmt.integer(total)} completions"
    if name == phases.WAITING:
        deadline = as_number(progress.get("deadline"))
        left = f" · {fmt.age(max(0.0, deadline - now))} left" if deadline is not None else ""
        return f"waiting for peers {fmt.integer(done)}/{fmt.integer(total)} groups{left}"
    if name == phases.TRAINING:
        if done is not None and total is not None:
            return f"training micro-batch {fmt.integer(done)}/{fmt.integer(total)}"
        return f"training on {fmt.integer(progress.get('samples'))} samples"
    return name


@dataclass(frozen=True)
class RoundClock:
    """Where the node is in its round: elapsed, the usual round time, the ETA."""
    round: int | None
    elapsed: float | None
    typical: float | None       # mean time/round_s of the last 5 rounds

    @property
    def fraction(self) -> float | None:
        if self.elapsed is None or not self.typical:
            return None
        return min(self.elapsed / self.typical, 0.99)     # never "done" before the record lands

    @property
    def eta(self) -> float | None:
        if self.elapsed is None or self.typical is None:
            return None
        return max(0.0, self.typical - self.elapsed)


def round_clock(state: RunState, progress: dict | None, now: float) -> RoundClock:
    typical = state.mean_last("time/round_s", 5)
    rnd = as_number((progress or {}).get("round"))
    started = as_number((progress or {}).get("round_started"))
    in_round = progress is not None and progress.get("phase") not in (
        phases.LOADING, phases.PAUSED, phases.STOPPED) and rnd is not None and rnd != state.last_round
    elapsed = now - started if in_round and started is not None else None
    return RoundClock(int(rnd) if in_round else None, elapsed if elapsed is None or math.isfinite(elapsed) else None,
                      typical)


@dataclass(frozen=True)
class RunProgress:
    """How far the whole run is: rounds finished of the rounds it was started for, and the
    time the rest should take at the usual round time. The percentage is ``done / total``
    and nothing else, so it can never disagree with the "4 of 30" beside it (the round in
    progress has its own bar)."""
    done: int
    total: int
    left_s: float | None        # None: no round time measured yet, or the node is not running

    @property
    def percent(self) -> int:
        pct = round(self.done * 100 / self.total)
        return min(pct, 99) if self.done < self.total else 100    # 100 % only when all are done


def run_progress(state: RunState, clock: RoundClock) -> RunProgress | None:
    """The run's progress, or None before its start record says how many rounds it has."""
    config = (state.start or {}).get("config")       # another program's file: any shape at all
    node = config.get("node") if isinstance(config, dict) else None
    total = as_number(node.get("rounds")) if isinstance(node, dict) else None
    if total is None or total < 1:
        return None
    total, done = int(total), min(int(total), state.last_round or 0)
    left = None
    if not state.finished and clock.typical is not None:
        left = max(0.0, (total - done) * clock.typical - (clock.elapsed or 0.0))
    return RunProgress(done, total, left)


@dataclass(eq=False)
class View:
    """What every widget draws from, replaced (never mutated) when anything changed: the
    app's ``view`` reactive hands it to the widgets that watch it."""
    state: RunState
    word: str                   # state cell: running · paused · finished · loading …
    colour: str
    sentence: str               # the header's version of it
    relay: RelayHealth
    progress: dict | None       # progress.json when it is this run's
    clock: RoundClock
    now: float


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
