"""The reward rule, pure: the <answer> format, pre-filters, answer comparison, binary / shaped value.

Nothing here starts a process or keeps time. The comparison (``answers_match``, math-verify)
can be made to hang by hostile answers (``9^{9^{9^{9^{9}}}}``, hundreds of nested parentheses)
and math-verify's own timeout uses ``signal.alarm`` (main thread only), so it is switched off
and the comparison runs in grader.py's worker process, which enforces the time budget from
outside; the pre-filters here reject the obvious bombs in microseconds first.
``grader.score`` puts the two together.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..common.turns import END_MARKERS
from .computation import computation_refusal, computations  # noqa: F401 - the rule's public names

# end-of-turn markers a completion may end with: EOS texts, and the plain prompt format's next
# turn, where a base model's sequence is stopped (turns.py)
END_TOKENS = END_MARKERS
REWARD_MODES = ("binary", "shaped")
# How an answer is compared with the reference: math-verify equivalence (gsm8k, math500, arith),
# the exact string, a regular expression (the reference is the pattern), or a reasoning-gym
# dataset's own verifier (the reference names the dataset item; see gym.py).
RULES = ("math", "exact", "regex", "reasoning_gym")


@dataclass(frozen=True)
class RewardSettings:
    mode: str = "binary"            # "binary": 1 iff format ok and correct; "shaped": + format credit
    require_think: bool = False     # also demand <think>…</think> before <answer> (the authors' rule)
    format_reward: float = 0.1      # "shaped" only: reward for a well-formed but wrong answer
    timeout_s: float = 0.5          # per-completion grading budget
    max_answer_chars: int = 200     # pre-filter: longer answers are rejected unread
    max_nesting: int = 10           # pre-filter: deeper ()[]{} nesting is rejected
    prefilter: bool = True          # off only to exercise the worker's timeout in tests
    rule: str = "math"              # one of RULES
    rule_setup: str = ""            # JSON the grader worker prepares from (reasoning_gym: the datasets)
    ignore_case: bool = False       # "exact" / "regex": compare case-insensitively

    def __post_init__(self):
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward must be one of {', '.join(REWARD_MODES)}, got {self.mode!r}")
        if self.rule not in RULES:
            raise ValueError(f"grade must be one of {', '.join(RULES)}, got {self.rule!r}")
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


# Words outside LaTeX commands, and what looks like a domain or a link: an answer is the
# answer, not a carrier for text (math-verify finds "40" in "40 Visit evil.example", so the
# phrase would be rewarded as correct and reinforced).
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
LINK = re.compile(r"://|www\.|[A-Za-z0-9-]\.[A-Za-z]{2,}")


def bare_answer_refusal(answer: str, reference: str) -> str | None:
    """Why a math answer is not a bare answer (None when it is): more words than its reference
    plus one (a unit: "18 dollars"), or a link or domain its reference does not have."""
    if LINK.search(answer) and not LINK.search(reference):
        return "a link in the answer"
    if len(_WORD.findall(answer)) > len(_WORD.findall(reference)) + 1:
        return "words around the answer"
    return None


def prefilter(answer: str, settings: RewardSettings) -> str | None:
    """Why ``answer`` is refused before grading, or None when it may be graded."""
    if len(answer) > settings.max_answer_chars:
        return f"answer longer than {settings.max_answer_chars} characters"
    if settings.rule == "reasoning_gym" and "__" in answer:
        return "dunder in the answer"       # the shape of a Python escape (some verifiers eval)
    if settings.rule != "math":
        return None                         # the rest guards sympy; the worker's budget bounds the others
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


# --- comparing an answer with the reference (runs in the grader worker) -------------------

def as_latex(text: str) -> str:
    """Math-mode text for math-verify's LaTeX extractor (it only reads $…$, \\[…\\], \\boxed{})."""
    # an unescaped $ opens math mode; "\\$" is a dollar sign inside it
    in_math = "\\boxed" in text or re.search(r"(?<!\\)\$", text) is not None
    return text if in_math else f"${text}$"


@lru_cache(maxsize=4096)
def _gold(reference: str):
    from math_verify import parse
    return parse(as_latex(reference), parsing_timeout=None) or parse(reference, parsing_timeout=None)


def answers_match(answer: str, reference: str) -> bool:
    """Does ``answer`` equal ``reference`` (math-verify)? The LaTeX reading first ("6 - 5i",
    "1, -2", "\\$18.00"); plain text ("18 dollars") only when that fails and the answer has no
    LaTeX in it. Unbounded time: call it through grader.py, never in a node's own threads."""
    from math_verify import parse, verify
    gold = _gold(reference)
    if verify(gold, parse(as_latex(answer), parsing_timeout=None), timeout_seconds=None):
        return True
    if any(c in answer for c in "\\{}$"):
        return False
    return bool(verify(gold, parse(answer, parsing_timeout=None), timeout_seconds=None))


def exact_match(answer: str, reference: str, ignore_case: bool = False) -> bool:
    """The same text once surrounding whitespace is dropped and inner runs collapsed (linear time)."""
    a, r = " ".join(answer.split()), " ".join(reference.split())
    return a.casefold() == r.casefold() if ignore_case else a == r


def reward_value(settings: RewardSettings, format_ok: bool, correct: bool | float) -> float:
    """1 for a well-formed correct answer; "shaped" also pays ``format_reward`` for form alone.

    ``correct`` may be a verifier's partial credit in [0, 1] (reasoning-gym): a well-formed answer
    then earns that score (shaped: at least ``format_reward``)."""
    score = min(1.0, max(0.0, float(correct)))
    if not format_ok:
        return 0.0
    if settings.mode == "shaped":
        return max(score, settings.format_reward)
    return score
