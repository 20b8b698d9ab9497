"""What "best" means, once: the node (heldout.HeldOut), the dashboard, the stop summary, export and
the model card all decide and word it here.

The rule: the best held-out eval is the most accurate one, the earliest of equals (fewer rounds
of training for the same accuracy), and the base model's eval (round 0) takes part. When the
best is round 0, no eval of the trained weights beat the base model: that is said in those
words everywhere, and the base model is never called "trained". Export then ships the newest
checkpoint's weights, labelled as not better than the base on the held-out prompts.

A second rule says when the held-out set is too small to tell anything: below MIN_PROMPTS
prompts no paired change can be significant at all (see ``min_prompts``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

BASE_ROUND = 0
ALPHA = 0.05


def better(accuracy: float, than: float | None) -> bool:
    """Whether an eval with ``accuracy`` replaces the best so far (``than``): strictly better."""
    return than is None or accuracy > than


@dataclass(frozen=True)
class Best:
    round: int
    accuracy: float
    base: float | None          # the base model's accuracy, when it was evaluated

    @property
    def beat_base(self) -> bool:
        return self.round != BASE_ROUND

    def words(self) -> str:
        """"best 61% at round 10 (base model 52%)" or "no eval beat the base model (52%)"."""
        if not self.beat_base:
            return f"no eval beat the base model ({100 * self.accuracy:.0f}%)"
        base = f" (base model {100 * self.base:.0f}%)" if self.base is not None else ""
        return f"best {100 * self.accuracy:.0f}% at round {self.round}{base}"


def best_of(evals: Iterable[tuple[int, float]]) -> tuple[int, float] | None:
    """(round, accuracy) of the best of ``evals`` ((round, accuracy) in round order, the base
    model's at round 0 first), or None when there are none."""
    best = None
    for rnd, acc in evals:
        if best is None or better(acc, best[1]):
            best = (rnd, acc)
    return best


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def from_records(records: Iterable[dict]) -> Best | None:
    """The run's best eval from its metrics records (base_eval and round records' eval/* keys);
    a round replayed after a resume counts once, as its newest record says."""
    base = None
    by_round: dict[int, float] = {}
    for r in records:
        if base is None and _number(r.get("eval/base_accuracy")) is not None:
            base = _number(r.get("eval/base_accuracy"))
        acc = _number(r.get("eval/accuracy"))
        rnd = r.get("eval/round", r.get("round"))
        if r.get("type", "round") == "round" and acc is not None and isinstance(rnd, int) and rnd > 0:
            by_round[rnd] = acc
    evals = ([(BASE_ROUND, base)] if base is not None else []) + sorted(by_round.items())
    found = best_of(evals)
    return Best(found[0], found[1], base) if found else None


def min_prompts(alpha: float = ALPHA) -> int:
    """The fewest held-out prompts on which a change against the base can be significant at all:
    even if every prompt changed the same way, the exact two-sided McNemar test (the reports'
    test, stats.mcnemar_two_sided; a test checks the two agree) gives p = 2 / 2**n, below
    ``alpha`` only from n = 6 on. Fewer prompts cannot tell."""
    n = 1
    while 2 * 0.5 ** n >= alpha:
        n += 1
    return n


MIN_PROMPTS = min_prompts()
TOO_FEW = "too few held-out prompts to tell"


def too_few(n) -> bool:
    return isinstance(n, int) and 0 < n < MIN_PROMPTS


def too_few_words(n: int) -> str:
    return f"{TOO_FEW}: {n} < {MIN_PROMPTS}"
