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
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..common.child import python_command, python_env
from .rewards import (RewardSettings, answers_match, bare_answer_refusal, check_format, computation_refusal,
                      exact_match, prefilter, reward_value)

STARTUP_TIMEOUT_S = 60.0        # a cold worker start (python + sympy imports), once per process
# Memory a worker may take past its prepared state. An answer is 12 characters away from
# gigabytes (``(1,)*10**9`` in an evaluating verifier); the time budget alone let it reach 4 GB.
MEMORY_LIMIT_MB = 512
MEMORY_ERROR = "grader error: MemoryError"              # the worker's own (RLIMIT_AS)
MEMORY_KILLED = "grader error: memory limit (watchdog)"  # the parent's: the worker is killed
log = logging.getLogger("ftis_edge.grader")
MATH_SETUP = '{"rule": "math"}'  # what a worker prepares: its rule (and, for reasoning_gym, the datasets)


# answers that touch sympy's lazily loaded parts (tuples, pi, complex, sets, equations)
WARM_UP = [("\\frac{1}{2}", "0.5"), ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
           ("6-5i", "6 - 5i"), ("\\{1,2\\}", "1, 2"), ("y=2x+3", "y = 2x + 3"),
           ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}"), ("x^2+1", "1+x^2"), ("18 dollars", "18")]


def _math_checker(setup: dict):
    for answer, reference in WARM_UP:       # load sympy's lazy parts before saying ready
        answers_match(answer, reference)
    return lambda answer, reference: float(answers_match(answer, reference))


def _regex_checker(setup: dict):
    import re
    flags = re.IGNORECASE if setup.get("ignore_case") else 0
    # the pattern is the user's own reference; the answer is untrusted: backtracking is what
    # the worker's budget is for
    return lambda answer, reference: float(re.fullmatch(reference, answer.strip(), flags) is not None)


def _gym_checker(setup: dict):
    from .gym_verify import checker         # imports reasoning_gym: only in its own workers
    return checker(setup)


CHECKERS = {"math": _math_checker, "regex": _regex_checker, "reasoning_gym": _gym_checker}


def _vm_bytes(key: str, pid: int | str = "self") -> int | None:
    """VmSize / VmHWM / VmRSS of a process from /proc (Linux), None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _limit_memory(extra_bytes: int) -> None:
    """Linux: the worker's address space may grow by ``extra_bytes`` past what it holds now
    (RLIMIT_AS; an allocation beyond raises MemoryError, the answer scores 0 and the worker lives
    on). Elsewhere RLIMIT_AS / RLIMIT_DATA are not enforced reliably (macOS): the parent's
    watchdog (``_Worker.ask``) kills a worker whose resident memory passes the same bound."""
    size = _vm_bytes("VmSize")
    if size is None or not sys.platform.startswith("linux"):
        return
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + extra_bytes if hard == resource.RLIM_INFINITY else min(size + extra_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _worker_main(setup_json: str = '{"rule": "math"}') -> None:
    """The grader process: prepare the rule named by ``setup_json``, then read JSON requests
    [id, answer, reference] on stdin and answer [id, score in [0, 1], error] on stdout, one
    line each."""
    logging.disable(logging.WARNING)      # math-verify warns that its own timeout is off
    # Ctrl-C in a terminal reaches the whole process group: the node decides what it means (stop
    # after the round); this worker ends when the node closes its stdin, without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")   # the protocol channel ...
    os.dup2(2, 1)                                        # ... and stray prints go to stderr
    sys.stdout = sys.stderr
    setup = json.loads(setup_json)
    check = CHECKERS[setup.get("rule", "math")](setup)
    _limit_memory(MEMORY_LIMIT_MB << 20)       # once prepared: what it holds now is its baseline
    out.write('["ready", true, null]\n')
    out.flush()
    for line in sys.stdin:
        req_id, answer, reference = json.loads(line)
        try:
            reply = [req_id, float(check(answer, reference)), None]
        except Exception as e:                  # noqa: BLE001 - any grader failure means "not correct"
            reply = [req_id, 0.0, f"grader error: {type(e).__name__}"]
        out.write(json.dumps(reply) + "\n")
        out.flush()


class _Worker:
    """One grader process; a reader thread turns its replies into a queue we can wait on
    with a timeout from any thread (plain subprocess: no multiprocessing re-import of the
    caller's __main__, works the same on every OS)."""

    def __init__(self, setup: str = MATH_SETUP):
        # Started in the caller's directory, which may be a shared run directory: never from it.
        self.process = subprocess.Popen(
            python_command("-c", "import sys; from ftis_edge.tasks.grader import _worker_main; "
                           "_worker_main(sys.argv[1])", setup),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=python_env(), text=True, bufsize=1,
            encoding="utf-8")
        self.replies: queue.Queue = queue.Queue()
        self.ready = False
        self.rss_limit: int | None = None       # the watchdog's bound, set once it is ready
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
            if self.ready:
                rss = self._rss()
                self.rss_limit = None if rss is None else rss + (MEMORY_LIMIT_MB << 20)
        return self.ready

    def _rss(self) -> int | None:
        try:
            import psutil
            return psutil.Process(self.process.pid).memory_info().rss
        except Exception:                        # noqa: BLE001 - no psutil, or the worker is gone
            return _vm_bytes("VmRSS", self.process.pid)

    def ask(self, req_id: int, answer: str, reference: str, timeout: float):
        """The worker's reply [id, correct, error]; None on timeout; raises OSError if it died."""
        self.process.stdin.write(json.dumps([req_id, answer, reference]) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:         # the memory watchdog: every 50 ms while it grades
            try:
                msg = self.replies.get(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None
                rss = self._rss() if self.rss_limit is not None else None
                if rss is not None and rss > self.rss_limit:
                    log.warning("grader worker passed its memory limit (%d MB resident, limit %d MB past its "
                                "start): killed", rss >> 20, MEMORY_LIMIT_MB)
                    return [req_id, 0.0, MEMORY_KILLED]
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
    score: float            # 1.0 correct, 0.0 wrong, in between: a verifier's partial credit
    timed_out: bool
    reason: str

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


class Grader:
    """One answer-checking rule (math-verify by default) behind a time budget: an active
    worker plus a hot spare, both prepared from ``setup``."""

    def __init__(self, setup: str = MATH_SETUP):
        self.setup = setup
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
            self._active, self._spare = (self._spare or _Worker(self.setup)), None
        if spare and (self._spare is None or not self._spare.alive()):
            self._spare = _Worker(self.setup)

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
                self._spare = _Worker(self.setup)

    def verify(self, answer: str, reference: str, budget_s: float) -> Verdict:
        """Does ``answer`` equal ``reference``? Gives up (timed_out) after ``budget_s``."""
        deadline = time.monotonic() + budget_s
        if not self._lock.acquire(timeout=max(0.0, budget_s)):
            return Verdict(0.0, True, "grader busy: budget spent waiting")
        try:
            cold = not self._ever_ready
            self._ensure_workers(spare=cold)     # later, a restart thread refills the spare
            if not self._wait_active(deadline):
                if not self._active.alive():
                    self._discard_active()
                return Verdict(0.0, True, "grader worker not ready within budget")
            if cold:                              # the first start is not this answer's budget
                deadline = time.monotonic() + budget_s
            self._next_id += 1
            try:
                reply = self._active.ask(self._next_id, answer, reference,
                                         deadline - time.monotonic())
            except (OSError, ValueError):
                self._discard_active()
                return Verdict(0.0, False, "grader worker crashed")
            if reply is None:                    # still busy on this answer: kill it
                self._discard_active()           # the spare takes over at once
                return Verdict(0.0, True, f"grading took longer than {budget_s:.3g} s")
            _, value, error = reply
            if error == MEMORY_KILLED:
                self._discard_active()           # still at it: the spare takes over
            elif error == MEMORY_ERROR:
                log.warning("grader: an answer hit the worker's memory limit (%d MB past its start): "
                            "scored 0", MEMORY_LIMIT_MB)
            value = min(1.0, max(0.0, float(value)))
            reason = error or ("correct" if value >= 1.0 else f"partial credit {value:.3g}" if value > 0
                               else "wrong answer")
            return Verdict(value, False, reason)
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


_GRADERS: dict[str, Grader] = {}
_GRADER_LOCK = threading.Lock()


def get_grader(setup: str = MATH_SETUP) -> Grader:
    """The process-wide grader for one rule setup (its workers start on first use)."""
    with _GRADER_LOCK:
        grader = _GRADERS.get(setup)
        if grader is None:
            grader = _GRADERS[setup] = Grader(setup)
            atexit.register(grader.close)
        return grader


def warm_up() -> bool:
    """Start the grader workers ahead of the first reward (they take ~1 s to import sympy): the
    math grader and every grader a task has asked for (``get_grader`` at its construction)."""
    get_grader()
    with _GRADER_LOCK:
        graders = list(_GRADERS.values())
    return all([g.warm_up() for g in graders])


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
    value, timed_out, reason = 0.0, False, fmt.reason
    if fmt.answer is not None:
        refused = prefilter(fmt.answer, settings) if settings.prefilter else None
        if refused is None and settings.prefilter and settings.rule == "math":
            refused = (bare_answer_refusal(fmt.answer, str(reference))
                       or computation_refusal(fmt.answer, str(reference)))
        if refused:
            reason = f"refused: {refused}"
        elif budget <= 0:
            timed_out, reason = True, "no time left in the batch budget"
        else:
            verdict = _verify(fmt.answer, str(reference), settings, budget)
            value, timed_out = verdict.score, verdict.timed_out
            reason = verdict.reason if fmt.ok or timed_out else f"{fmt.reason} ({verdict.reason})"
    breakdown = {"format_ok": fmt.ok, "correct": value >= 1.0, "answer": fmt.answer,
                 "timed_out": timed_out, "reason": reason,
                 "seconds": round(time.monotonic() - t0, 6)}
    if 0.0 < value < 1.0:
        breakdown["partial"] = value
    return reward_value(settings, fmt.ok, value), breakdown


def _verify(answer: str, reference: str, settings: RewardSettings, budget_s: float) -> Verdict:
    """The rule's comparison: "exact" here (linear time), the others in their grader worker."""
    if settings.rule == "exact":
        ok = exact_match(answer, reference, settings.ignore_case)
        return Verdict(float(ok), False, "correct" if ok else "wrong answer")
    return get_grader(rule_setup(settings)).verify(answer, reference, budget_s)


def rule_setup(settings: RewardSettings) -> str:
    """The setup of the grader workers that check answers under ``settings``."""
    if settings.rule_setup:
        return settings.rule_setup
    if settings.rule == "math":
        return MATH_SETUP
    return json.dumps({"rule": settings.rule, "ignore_case": settings.ignore_case})


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
