"""Held-out eval inside the run: greedy accuracy on a fixed slice of the task's eval split.

What a node is judged on must be what its owner takes home: greedy answers to prompts it never
trained on (intake refuses eval prompts as training data, ``Task.is_trainable``). Training reward
is the mean score of *sampled* completions of *training* prompts, and it can rise while held-out
accuracy falls (docs/results.md H5: a Gemma node copied its peers' long style, ran out of tokens
and dropped the answer tag). So every ``eval.every`` rounds, at round 0 (the base model) and at
the end, the node scores its current weights here:

* with the generator it already has loaded (no reload), all prompts in one continuous batch
  (``generate_many``, as ``ftis-edge eval`` does), greedy, at the task's own length cap;
* on the same ``eval.prompts`` prompts every time, so two evals compare prompt by prompt: the
  change against round 0 is a *paired* difference (its SE counts only the prompts that changed),
  far tighter than two independent intervals;
* drawing no random number from the training streams: greedy needs none, and the generator's
  per-call generator is seeded locally (loop.py), so training is the same with the eval on or off.

``EvalResult`` holds one eval per prompt; ``HeldOut`` runs them and keeps the base and the best.
The statistics (Wilson interval, paired difference, exact McNemar) are pure functions in stats.py.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from ..metrics.stats import Z95, paired_change, wilson_interval

log = logging.getLogger("ftis_edge.run.heldout")


@dataclass(frozen=True)
class EvalResult:
    """One held-out eval: per prompt (the fixed order) whether the greedy answer was right (correct
    answer in the required format: reward >= 1, as ``ftis-edge eval`` counts), well-formed, and cut
    at the length cap."""
    round: int
    correct: tuple[bool, ...]
    format_ok: tuple[bool, ...]
    truncated: tuple[bool, ...]
    tokens: int = 0
    seconds: float = 0.0
    timed_out: int = 0

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(sum(self.correct), self.n)

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("correct", "format_ok", "truncated"):
            d[k] = [bool(v) for v in d[k]]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        return cls(round=int(d["round"]), correct=tuple(bool(v) for v in d["correct"]),
                   format_ok=tuple(bool(v) for v in d["format_ok"]),
                   truncated=tuple(bool(v) for v in d["truncated"]), tokens=int(d.get("tokens", 0)),
                   seconds=float(d.get("seconds", 0.0)), timed_out=int(d.get("timed_out", 0)))

    @classmethod
    def from_items(cls, round_: int, items: Sequence[dict]) -> "EvalResult":
        """From ``ftis-edge eval``'s items (``--json``), in their order."""
        return cls(round=round_, correct=tuple(float(it["reward"]) >= 1.0 for it in items),
                   format_ok=tuple(bool(it["format_ok"]) for it in items),
                   truncated=tuple(it.get("finish_reason") == "length" for it in items),
                   tokens=sum(int(it.get("tokens", 0)) for it in items))


# --- the eval inside the run --------------------------------------------------------------------

def eval_set(task, limit: int) -> list:
    """The first ``limit`` prompts of the task's eval split ([] when it has none)."""
    try:
        return list(task.eval_prompts(limit))
    except NotImplementedError:
        return []


class HeldOut:
    """Scores the generator's current weights on a fixed held-out set; keeps base, best and last.

    ``prompts`` = 0 or a task without an eval split: ``active`` is False (said once, in the log).
    """

    def __init__(self, task, bundle, generator, *, every: int, prompts: int, max_new_tokens: int):
        from ..generate.base import SamplerSettings

        self.every = every
        self.task, self.generator = task, generator
        self.prompts = eval_set(task, prompts) if every > 0 and prompts > 0 else []
        if every > 0 and prompts > 0 and not self.prompts:
            log.warning("held-out eval: task %s has no eval split, so this run records no held-out accuracy",
                        getattr(task, "name", task))
        # a task that trains on its eval split (math500 has one split; gsm8k with split = "test") holds
        # nothing out: the eval still runs (it tracks what the owner gets), but says it is not held out
        self.overlap = sum(1 for p in self.prompts if task.is_trainable(p.id))
        if self.overlap:
            log.warning("held-out eval: %d of its %d prompts are training prompts too (task %s trains on its "
                        "eval split), so its accuracy is not a held-out measure", self.overlap, len(self.prompts),
                        getattr(task, "name", task))
        self.ids = [bundle.encode(bundle.render_prompt(task.messages(p.question))) for p in self.prompts]
        # greedy: temperature 0 takes the arg-max, no random number is drawn (the seed is unused)
        self.sampler = SamplerSettings(temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, seed=0)
        self.base: EvalResult | None = None
        self.best: EvalResult | None = None
        self.last: EvalResult | None = None

    @property
    def active(self) -> bool:
        return bool(self.prompts)

    def due(self, round_: int, last: bool) -> bool:
        """Round 0 (the base model), every ``every`` rounds, and the run's last round."""
        if not self.active:
            return False
        return round_ == 0 or last or round_ % self.every == 0

    def run(self, round_: int) -> EvalResult:
        """Greedy answers to every held-out prompt with the weights the generator holds now."""
        t0 = time.perf_counter()
        groups = self.generator.generate_many(self.ids, 1, [self.sampler] * len(self.ids))
        comps = [g[0] for g in groups]
        graded = self.task.reward_many([c.text for c in comps], [p.reference for p in self.prompts])
        result = EvalResult(round=round_, correct=tuple(float(v) >= 1.0 for v, _ in graded),
                            format_ok=tuple(bool(b.get("format_ok")) for _, b in graded),
                            truncated=tuple(c.finish_reason == "length" for c in comps),
                            tokens=sum(len(c.token_ids) for c in comps), seconds=time.perf_counter() - t0,
                            timed_out=sum(bool(b.get("timed_out")) for _, b in graded))
        if result.timed_out:
            log.warning("held-out eval: %d of %d answers ran out of the grading budget and count as wrong",
                        result.timed_out, result.n)
        self.observe(result)
        return result

    def observe(self, result: EvalResult) -> None:
        """Take a result in as the newest; the first one is the base, the most accurate the best
        (the earliest of equals: fewer rounds of training for the same accuracy)."""
        from ..metrics.best import better      # the one rule of "best" (best.py), here and in every reader
        if self.base is None:
            self.base = result
        if better(result.accuracy, None if self.best is None else self.best.accuracy):
            self.best = result
        self.last = result

    def is_best(self, result: EvalResult) -> bool:
        return self.best is result

    def record(self, result: EvalResult) -> dict:
        """The round record's eval/* keys for ``result`` (paired against the base)."""
        lo, hi = result.interval
        out = {"eval/accuracy": result.accuracy, "eval/accuracy_lo": lo, "eval/accuracy_hi": hi,
               "eval/format": sum(result.format_ok) / result.n if result.n else None,
               "eval/truncated": sum(result.truncated) / result.n if result.n else None,
               "eval/n": result.n, "eval/round": result.round, "eval/wall_s": result.seconds,
               "eval/tokens": result.tokens}
        if self.base is not None:
            ch = paired_change(result.correct, self.base.correct)
            clo, chi = ch.interval
            out.update({"eval/base_accuracy": self.base.accuracy, "eval/change": ch.diff,
                        "eval/change_se": ch.se, "eval/change_lo": clo, "eval/change_hi": chi})
        if self.best is not None:
            out.update({"eval/best_accuracy": self.best.accuracy, "eval/best_round": self.best.round})
        return out

    def base_record(self) -> dict:
        """The base model's eval (round 0), for the first round's record: eval/base_* keys."""
        if self.base is None:
            return {}
        lo, hi = self.base.interval
        b = self.base
        return {"eval/base_accuracy": b.accuracy, "eval/base_lo": lo, "eval/base_hi": hi,
                "eval/base_format": sum(b.format_ok) / b.n, "eval/base_truncated": sum(b.truncated) / b.n,
                "eval/base_wall_s": b.seconds, "eval/n": b.n}

    # --- checkpoint ----------------------------------------------------------------------------
    def state(self) -> dict:
        return {k: (getattr(self, k).as_dict() if getattr(self, k) is not None else None)
                for k in ("base", "best", "last")}

    def load_state(self, state: dict | None) -> None:
        if not state:
            return
        for k in ("base", "best", "last"):
            if state.get(k) is not None:
                setattr(self, k, EvalResult.from_dict(state[k]))
        if self.base is not None and self.base.n != len(self.prompts):
            log.warning("held-out eval: the checkpoint's evals used %d prompts, this config %d: "
                        "starting the comparison afresh", self.base.n, len(self.prompts))
            self.base = self.best = self.last = None


def eval_line(rec: dict) -> str | None:
    """The headless line's part: "held-out 61% [49–72] (base 52%, +9 pts ± 6)"; None without an eval."""
    acc = rec.get("eval/accuracy")
    if acc is None:
        return None
    out = f"held-out {100 * acc:.0f}%"
    lo, hi = rec.get("eval/accuracy_lo"), rec.get("eval/accuracy_hi")
    if lo is not None and hi is not None:
        out += f" [{100 * lo:.0f}–{100 * hi:.0f}]"
    base, change, se = rec.get("eval/base_accuracy"), rec.get("eval/change"), rec.get("eval/change_se")
    from ..metrics.best import too_few, too_few_words
    if base is not None and rec.get("eval/round") != 0:
        out += f" (base {100 * base:.0f}%"
        if too_few(rec.get("eval/n")):
            out += f"; {too_few_words(rec['eval/n'])}"
        elif change is not None and se is not None:
            out += f", {change_words(change, se)}"
        out += ")"
    return out


def change_words(change: float, se: float) -> str:
    """"+9 pts ± 6"; "no prompt changed" rather than a false-precision "+0 pts ± 0"."""
    if se == 0 and change == 0:
        return "no prompt changed"
    return f"{100 * change:+.0f} pts ± {100 * Z95 * se:.0f}"
