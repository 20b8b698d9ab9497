"""Verifiable rewards: the <answer> format rule, then a bounded math-verify check.

Completions from peers are untrusted text, and a symbolic grader can be made to hang
(``9^{9^{9^{9^{9}}}}``, hundreds of nested parentheses). math-verify's own timeout uses
``signal.alarm``, which only works in the main thread, so it is switched off here and the
budget is enforced from outside:

1. cheap pre-filters in this process (answer length, bracket depth, power towers, huge
   exponents or factorials) reject the obvious bombs in microseconds;
2. everything else is checked by a persistent grader worker process (a plain Python
   subprocess speaking JSON lines) that is killed when it overruns its budget; a hot spare
   worker takes over at once and a new spare starts in the background.

So a call returns within ``timeout_s`` from any thread, once the first worker has started
(a cold start is allowed ``STARTUP_TIMEOUT_S``; ``warm_up()`` does it ahead of time).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

STARTUP_TIMEOUT_S = 60.0        # a cold worker start (python + sympy imports), once per process
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<end_of_turn>", "<|eot_id|>")
REWARD_MODES = ("binary", "shaped")


@dataclass(frozen=True)
class RewardSettings:
    mode: str = "binary"            # "binary": 1 iff format ok and correct; "shaped": + format credit
    require_think: bool = False     # also demand <think>…</think> before <answer> (the authors' rule)
    format_reward: float = 0.1      # "shaped" only: reward for a well-formed but wrong answer
    timeout_s: float = 0.5          # per-completion grading budget
    max_answer_chars: int = 200     # pre-filter: longer answers are rejected unread
    max_nesting: int = 10           # pre-filter: deeper ()[]{} nesting is rejected
    prefilter: bool = True          # off only to exercise the worker's timeout in tests

    def __post_init__(self):
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward must be one of {', '.join(REWARD_MODES)}, got {self.mode!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {self.format_reward}")


# --- the format rule --------------------------------------------------------------------

@dataclass(frozen=True)
class FormatCheck:
    ok: bool
    answer: str | None      # the text inside the single <answer>…</answer>, when there is one
    reason: str


def _strip_end(text: str) -> str:
    """Drop trailing whitespace and end-of-turn tokens a decoder may have left in the text."""
    body = text.rstrip()
    changed = True
    while changed:
        changed = False
        for tok in END_TOKENS:
            if body.endswith(tok):
                body = body[: -len(tok)].rstrip()
                changed = True
    return body


def check_format(text: str, require_think: bool = False) -> FormatCheck:
    """Exactly one <answer>…</answer>, non-empty, closing the completion (linear time)."""
    body = _strip_end(text)
    n_open, n_close = body.count("<answer>"), body.count("</answer>")
    if n_open == 0 and n_close == 0:
        return FormatCheck(False, None, "no <answer> tag")
    if n_open != 1 or n_close != 1:
        return FormatCheck(False, None,
                           f"expected one <answer>…</answer>, found {n_open} open / {n_close} close")
    start, end = body.find("<answer>"), body.find("</answer>")
    if end < start:
        return FormatCheck(False, None, "</answer> comes before <answer>")
    answer = body[start + len("<answer>"):end].strip()
    if not answer:
        return FormatCheck(False, None, "empty <answer></answer>")
    if not body.endswith("</answer>"):
        return FormatCheck(False, answer, "text after </answer>")
    if require_think:
        if body.count("<think>") != 1 or body.count("</think>") != 1:
            return FormatCheck(False, answer, "expected one <think>…</think>")
        if not body.find("<think>") < body.find("</think>") < start:
            return FormatCheck(False, answer, "<think>…</think> must come before <answer>")
    return FormatCheck(True, answer, "ok")


# --- pre-filters: reject grader bombs without touching sympy ------------------------------

def _exponents(answer: str):
    """(exponent, stacked) for each ^ or ** : the exponent is a balanced {...} group or the next
    token; ``stacked`` says another power follows the token at once (9^9^9, 2**2**9)."""
    i, n = 0, len(answer)
    while i < n:
        if answer[i] == "^" or answer.startswith("**", i):
            i += 1 if answer[i] == "^" else 2
            while i < n and answer[i] == " ":
                i += 1
            j = i
            if i < n and answer[i] == "{":
                depth = 0
                while j < n:
                    depth += {"{": 1, "}": -1}.get(answer[j], 0)
                    j += 1
                    if depth == 0:
                        break
                exponent = answer[i + 1:j - 1]
            else:
                while j < n and (answer[j].isalnum() or answer[j] == "."):
                    j += 1
                exponent = answer[i:j]
            rest = answer[j:].lstrip()
            yield exponent, rest.startswith(("^", "**"))
            i = j
            continue
        i += 1


def prefilter(answer: str, settings: RewardSettings) -> str | None:
    """Why ``answer`` is refused before grading, or None when it may be graded."""
    if len(answer) > settings.max_answer_chars:
        return f"answer longer than {settings.max_answer_chars} characters"
    depth = deepest = 0
    for ch in answer:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    if deepest > settings.max_nesting:
        return f"brackets nested deeper than {settings.max_nesting}"
    for exponent, stacked in _exponents(answer):
        if stacked or "^" in exponent or "**" in exponent:
            return "power tower in the answer"
        digits = "".join(c for c in exponent if c.isdigit())
        if len(digits) > 5:
            return "exponent too large"
    for i, ch in enumerate(answer):        # 1234567! would take sympy forever
        if ch == "!":
            j = i
            while j > 0 and answer[j - 1].isdigit():
                j -= 1
            if i - j > 4:
                return "factorial too large"
    return None


# --- the grader worker --------------------------------------------------------------------

# answers that touch sympy's lazily loaded parts (tuples, pi, complex, sets, equations)
WARM_UP = [("\\frac{1}{2}", "0.5"), ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
           ("6-5i", "6 - 5i"), ("\\{1,2\\}", "1, 2"), ("y=2x+3", "y = 2x + 3"),
           ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}"), ("x^2+1", "1+x^2"), ("18 dollars", "18")]


def as_latex(text: str) -> str:
    """Math-mode text for math-verify's LaTeX extractor (it only reads $…$, \\[…\\], \\boxed{})."""
    # an unescaped $ opens math mode; "\\$" is a dollar sign inside it
    in_math = "\\boxed" in text or re.search(r"(?<!\\)\$", text) is not None
    return text if in_math else f"${text}$"


def _worker_main() -> None:
    """The grader process: read JSON requests [id, answer, reference] on stdin, answer
    [id, correct, error] on stdout, one line each."""
    import json
    import sys

    logging.disable(logging.WARNING)      # math-verify warns that its own timeout is off
    from math_verify import parse, verify

    @lru_cache(maxsize=4096)
    def gold(reference: str):
        return parse(as_latex(reference), parsing_timeout=None) or parse(reference, parsing_timeout=None)

    def check(answer: str, reference: str) -> bool:
        """The LaTeX reading first ("6 - 5i", "1, -2", "\\$18.00"); plain text ("18 dollars")
        only when that fails and the answer has no LaTeX in it."""
        g = gold(reference)
        if verify(g, parse(as_latex(answer), parsing_timeout=None), timeout_seconds=None):
            return True
        if any(c in answer for c in "\\{}$"):
            return False
        return bool(verify(g, parse(answer, parsing_timeout=None), timeout_seconds=None))

    out = os.fdopen(os.dup(1), "w", encoding="utf-8")   # the protocol channel ...
    os.dup2(2, 1)                                        # ... and stray prints go to stderr
    sys.stdout = sys.stderr
    for answer, reference in WARM_UP:       # load sympy's lazy parts before saying ready
        check(answer, reference)
    out.write('["ready", true, null]\n')
    out.flush()
    for line in sys.stdin:
        req_id, answer, reference = json.loads(line)
        try:
            reply = [req_id, check(answer, reference), None]
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
            [sys.executable, "-c", "from ftis_edge.tasks.rewards import _worker_main; _worker_main()"],
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

def _value(settings: RewardSettings, format_ok: bool, correct: bool) -> float:
    if format_ok and correct:
        return 1.0
    if format_ok and settings.mode == "shaped":
        return settings.format_reward
    return 0.0


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
    return _value(settings, fmt.ok, correct), breakdown


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
