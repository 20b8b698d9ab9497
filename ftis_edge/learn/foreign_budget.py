"""What text claimed to come from another tokenizer may move the weights over a run (issue 62 item 2).

The learner's bound (``plausibility.FOREIGN_SAMPLE_WEIGHT`` a sample, ``FOREIGN_STEP_WEIGHT`` a
step) scales such a sample's term, but a weight is not a bound on the update: in a step whose
only signal is those samples (own groups with no advantage) the optimiser rescales the gradient,
and a two-samples-a-step drip still rose +2.6 nats over its control in 20 steps. So this budget
bounds each sample's *pull*, |advantage| x weight x the learner's factor (what it adds to the
step's gradient before the optimiser), against the rest of the step and over a window of steps:

* **step share**: all claimed-foreign samples of a step pull at most ``share`` of the step's
  total; with no other signal in the step they pull nothing (the step has no signal and is
  skipped), so they can only ride along with what the node checks itself;
* **per peer, per window**: summed over the last ``window`` steps, one peer's share of each step
  at most ``peer_budget``, and every claimed-foreign sender's together at most ``kind_budget``
  (a crowd of ids shares the one kind budget).

The samples no judge checks (another tokenizer, ``judge_foreign`` off) are also the ones whose IS
weight the round caps at 1 when such text trains (rounds.Round.objective_kwargs).

Pure and deterministic: ``apply`` returns the reweighted samples and remembers the shares taken;
own and token-level samples are never touched. Used with ``train.other_tokenizer`` and
``train.foreign_budget`` on.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ..rollout.samples import OWN, TrainSample

DEFAULT_SHARE = 0.125          # = plausibility.FOREIGN_STEP_WEIGHT: the step bound, now on the pull
DEFAULT_WINDOW = 20
DEFAULT_PEER_BUDGET = 0.5      # half of one step's pull per peer over 20 steps (2.5 % a step on average)
DEFAULT_KIND_BUDGET = 1.0      # one step's pull over 20 steps for every claimed-foreign sender together


def claimed_foreign(s: TrainSample) -> bool:
    """A peer sample weighted per sequence or span: text re-tokenized here, which no judge checks."""
    return s.source != OWN and s.level != "token"


@dataclass
class ForeignBudget:
    share: float = DEFAULT_SHARE
    window: int = DEFAULT_WINDOW
    peer_budget: float = DEFAULT_PEER_BUDGET
    kind_budget: float = DEFAULT_KIND_BUDGET
    steps: deque = field(default=None)      # per step: {peer: its share of the step's pull}

    def __post_init__(self):
        if not 0.0 <= self.share < 1.0:
            raise ValueError(f"foreign budget share must lie in [0, 1), got {self.share!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"foreign budget window must be a whole number of steps >= 1, got {self.window!r}")
        if self.peer_budget < 0 or self.kind_budget < 0:
            raise ValueError("foreign budgets must be >= 0")
        self.steps = deque(maxlen=self.window)

    def spent(self) -> tuple[dict, float]:
        """(each peer's summed share over the window, all of them together)."""
        per: dict[str, float] = {}
        for step in self.steps:
            for peer, x in step.items():
                per[peer] = per.get(peer, 0.0) + x
        return per, sum(per.values())

    def apply(self, samples: Sequence[TrainSample], factors: Sequence[float] | None = None) -> list[TrainSample]:
        """The step's samples with the claimed-foreign ones' weights scaled to the budget.
        ``factors``: the learner's factor per sample (``batch.learner_factors``; default 1)."""
        factors = [1.0] * len(samples) if factors is None else list(factors)
        pull = [abs(float(s.advantage)) * float(s.weight) * f for s, f in zip(samples, factors)]
        foreign = [i for i, s in enumerate(samples) if claimed_foreign(s)]
        if not foreign:
            self.steps.append({})
            return list(samples)
        fset = set(foreign)
        rest = sum(p for i, p in enumerate(pull) if i not in fset)
        by_peer: dict[str, float] = {}
        for i in foreign:
            by_peer[samples[i].source] = by_peer.get(samples[i].source, 0.0) + pull[i]
        total_f = sum(by_peer.values())
        # the step share: F' / (rest + F') <= share
        step_scale = 1.0 if total_f == 0 else min(1.0, self.share / (1.0 - self.share) * rest / total_f)
        per_spent, kind_spent = self.spent()
        denom = rest + total_f * step_scale
        scale: dict[str, float] = {}
        for peer, f in by_peer.items():
            want = f * step_scale / denom if denom else 0.0
            left = max(0.0, self.peer_budget - per_spent.get(peer, 0.0))
            scale[peer] = step_scale * (min(1.0, left / want) if want > 0 else 1.0)
        taken = {p: by_peer[p] * scale[p] / denom if denom else 0.0 for p in by_peer}
        kind_left = max(0.0, self.kind_budget - kind_spent)
        if sum(taken.values()) > kind_left:             # the crowd shares one kind budget
            k = kind_left / sum(taken.values())
            scale = {p: x * k for p, x in scale.items()}
            taken = {p: x * k for p, x in taken.items()}
        self.steps.append({p: x for p, x in taken.items() if x > 0})
        return [dataclasses.replace(s, weight=s.weight * scale[s.source]) if i in fset and scale[s.source] != 1.0
                else s for i, s in enumerate(samples)]

    # --- checkpoint -------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"window": self.window, "steps": [dict(s) for s in self.steps]}

    def load_state(self, state: dict | None) -> None:
        if not state or state.get("window") != self.window:
            return
        try:
            steps = [{str(p): float(x) for p, x in s.items()} for s in state["steps"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"foreign budget in the checkpoint does not read: {e!r}") from None
        self.steps = deque(steps[-self.window:], maxlen=self.window)
