"""The grader process: the reward rule's answer comparison under a time budget, from any thread.

Completions from peers are untrusted text, and a symbolic comparison can be made to hang, so
``rewards.answers_match`` runs in a persistent grader worker process (a plain Python subprocess
speaking JSON lines) that is killed when it overruns its budget; a hot spare worker takes over
at once and a new spare starts in the background. The cheap pre-filters of rewards.py run in
this process first.

So a call returns within ``timeout_s`` from any thread, once the first worker has started
(a cold start is allowed ``STARTUP_TIMEOUT_S``; ``warm_up()`` does it ahead of time).
``score`` / ``score_many`` grade completions: the rule of rewards.py with this comparison.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .rewards import RewardSettings, answers_match, check_format, prefilter, reward_value

STARTUP_TIMEOUT_S = 60.0        # a cold worker start (python + sympy imports), once per process


# answers that touch sympy's lazily loaded parts (tuples, pi, complex, sets, equations)
WARM_UP = [("\\frac{1}{2}", "0.5"), ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
           ("6-5i", "6 - 5i"), ("\\{1,2\\}", "1, 2"), ("y=2x+3", "y = 2x + 3"),
           ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}"), ("x^2+1", "1+x^2"), ("18 dollars", "18")]


def _worker_main() -> None:
    """The grader process: read JSON requests [id, answer, reference] on stdin, answer
    [id, correct, error] on stdout, one line each."""
    logging.disable(logging.WARNING)      # math-verify warns that its own timeout is off
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")   # the protocol channel ...
    os.dup2(2, 1)                                        # ... and stray prints go to stderr
    sys.stdout = sys.stderr
    for answer, reference in WARM_UP:       # load sympy's lazy parts before saying ready
        answers_match(answer, reference)
    out.write('["ready", true, null]\n')
    out.flush()
    for line in sys.stdin:
        req_id, answer, reference = json.loads(line)
        try:
            reply = [req_id, answers_match(answer, reference), None]
        except Exception as e:                  # noqa: BLE001 - any grader failure means "not correct"
            reply = [req_id, False, f"grader error: {type(e).__name__}"]
        out.write(json.dumps(reply) + "\n")
        out.flush()


class _Worker:
    """One grader process; a reader thread turns its replies into a queue we can wait on
    with a timeout from any thread (plain subprocess: no multiprocessing re-import of the
    caller's __main__, works the same on every OS)."""

    def __init__(self):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from ftis_edge.tasks.grader import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
            encoding="utf-8")
        self.replies: queue.Queue = queue.Queue()
        self.ready = False
        threading.Thread(target=self._read, daemon=True, name="ftis-grader-reader").start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.replies.put(json.loads(line))
            except ValueError:
                continue                        # not ours: ignore
        self.replies.put(None)                  # EOF: the worker is gone

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        if not self.ready:
            try:
                msg = self.replies.get(timeout=max(0.0, timeout))
            except queue.Empty:
                return False
            self.ready = msg is not None and msg[0] == "ready"
        return self.ready

    def ask(self, req_id: int, answer: str, reference: str, timeout: float):
        """The worker's reply [id, correct, error]; None on timeout; raises OSError if it died."""
        self.process.stdin.write(json.dumps([req_id, answer, reference]) + "\n")
        self.process.stdin.flush()
        try:
            msg = self.replies.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if msg is None or msg[0] != req_id:
            raise OSError("grader worker exited")
        return msg

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=2.0)
        except Exception:                        # noqa: BLE001 - already gone
            pass
        for f in (self.process.stdin, self.process.stdout):
            try:
                f.close()
            except Exception:                    # noqa: BLE001
                pass


@dataclass(frozen=True)
class Verdict:
    correct: bool
    timed_out: bool
    reason: str


class Grader:
    """math-verify behind a time budget: an active worker plus a hot spare."""

    def __init__(self):
        self._lock = threading.Lock()           # one request in flight on the active worker
        self._active: _Worker | None = None
        self._spare: _Worker | None = None
        self._ever_ready = False
        self._closed = False
        self._next_id = 0
        self.restarts = 0

    def warm_up(self, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        """Start the workers now and wait until the active one and the spare are both ready,
        so later calls meet their budget even right after a kill."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._ensure_workers()
            if not self._wait_active(deadline):
                return False
            spare = self._spare
        return spare.wait_ready(deadline - time.monotonic())

    def _ensure_workers(self, spare: bool = True) -> None:
        self._closed = False
        if self._active is not None and not self._active.alive():
            self._active.kill()
            self._active = None
        if self._active is None:
            self._active, self._spare = (self._spare or _Worker()), None
        if spare and (self._spare is None or not self._spare.alive()):
            self._spare = _Worker()

    def _wait_active(self, deadline: float) -> bool:
        if not self._ever_ready:               # cold start: not the caller's budget to pay
            deadline = max(deadline, time.monotonic() + STARTUP_TIMEOUT_S)
        ok = self._active.wait_ready(deadline - time.monotonic())
        self._ever_ready |= ok
        return ok

    def _discard_active(self) -> None:
        """Drop the active worker; the spare takes over. Killing the old one and starting a
        new spare happen on a helper thread, so the caller is not billed for them."""
        old, self._active, self._spare = self._active, self._spare, None
        self.restarts += 1
        threading.Thread(target=self._replace, args=(old,), daemon=True,
                         name="ftis-grader-restart").start()

    def _replace(self, old: _Worker) -> None:
        old.kill()
        with self._lock:
            if self._spare is None and not self._closed:
                self._spare = _Worker()

    def verify(self, answer: str, reference: str, budget_s: float) -> Verdict:
        """Does ``answer`` equal ``reference``? Gives up (timed_out) after ``budget_s``."""
        deadline = time.monotonic() + budget_s
        if not self._lock.acquire(timeout=max(0.0, budget_s)):
            return Verdict(False, True, "grader busy: budget spent waiting")
        try:
            cold = not self._ever_ready
            self._ensure_workers(spare=cold)     # later, a restart thread refills the spare
            if not self._wait_active(deadline):
                if not self._active.alive():
                    self._discard_active()
                return Verdict(False, True, "grader worker not ready within budget")
            if cold:                              # the first start is not this answer's budget
                deadline = time.monotonic() + budget_s
            self._next_id += 1
            try:
                reply = self._active.ask(self._next_id, answer, reference,
                                         deadline - time.monotonic())
            except (OSError, ValueError):
                self._discard_active()
                return Verdict(False, False, "grader worker crashed")
            if reply is None:                    # still busy on this answer: kill it
                self._discard_active()           # the spare takes over at once
                return Verdict(False, True, f"grading took longer than {budget_s:.3g} s")
            _, correct, error = reply
            return Verdict(bool(correct), False, error or ("correct" if correct else "wrong answer"))
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            for w in (self._active, self._spare):
                if w is not None:
                    w.kill()
            self._active = self._spare = None
            self._ever_ready = False
            self._closed = True


_GRADER: Grader | None = None
_GRADER_LOCK = threading.Lock()


def get_grader() -> Grader:
    """The process-wide grader (its workers start on first use)."""
    global _GRADER
    with _GRADER_LOCK:
        if _GRADER is None:
            _GRADER = Grader()
            atexit.register(_GRADER.close)
        return _GRADER


def warm_up() -> bool:
    """Start the grader workers ahead of the first reward (they take ~1 s to import sympy)."""
    return get_grader().warm_up()


# --- scoring ---------------------------------------------------------------------------

def score(text: str, reference: str, settings: RewardSettings = RewardSettings(),
          budget_s: float | None = None) -> tuple[float, dict]:
    """Reward of one completion and its breakdown.

    breakdown = {format_ok, correct, answer, timed_out, reason, seconds}; ``correct`` is
    whether the extracted answer verifies, even when the format failed (then the value is 0).
    """
    t0 = time.monotonic()
    budget = settings.timeout_s if budget_s is None else min(settings.timeout_s, budget_s)
    fmt = check_format(text if isinstance(text, str) else "", settings.require_think)
    correct, timed_out, reason = False, False, fmt.reason
    if fmt.answer is not None:
        refused = prefilter(fmt.answer, settings) if settings.prefilter else None
        if refused:
            reason = f"refused: {refused}"
        elif budget <= 0:
            timed_out, reason = True, "no time left in the batch budget"
        else:
            verdict = get_grader().verify(fmt.answer, str(reference), budget)
            correct, timed_out = verdict.correct, verdict.timed_out
            reason = verdict.reason if fmt.ok or timed_out else f"{fmt.reason} ({verdict.reason})"
    breakdown = {"format_ok": fmt.ok, "correct": correct, "answer": fmt.answer,
                 "timed_out": timed_out, "reason": reason,
                 "seconds": round(time.monotonic() - t0, 6)}
    return reward_value(settings, fmt.ok, correct), breakdown


def score_many(texts: Sequence[str], references: Sequence[str],
               settings: RewardSettings = RewardSettings(),
               total_budget_s: float | None = None) -> list[tuple[float, dict]]:
    """Score a batch in order; once ``total_budget_s`` is spent the rest are timed out."""
    if len(texts) != len(references):
        raise ValueError(f"{len(texts)} texts but {len(references)} references")
    deadline = None if total_budget_s is None else time.monotonic() + total_budget_s
    out = []
    for text, ref in zip(texts, references):
        left = None if deadline is None else deadline - time.monotonic()
        out.append(score(text, ref, settings, budget_s=left))
    return out
