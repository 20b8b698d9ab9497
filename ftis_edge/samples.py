"""What one training sample is, shared by the batch builder, the learner and intake.

No torch and nothing of the node: the learner trains on ``TrainSample``s, ``batch`` makes
them from groups, and intake checks peer groups with ``carries_signal`` before any of them
is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

OWN = "own"                        # TrainSample.source of this node's own samples


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]          # the learner's own token ids of the completion
    gen_logprobs: list[float] | None   # behaviour log-prob per completion token; None for cross-tokenizer
    gen_logprob_sum: float | None      # generator's summed log-prob (sequence-level / cross-tokenizer)
    advantage: float
    sequence_level: bool = False
    source: str = OWN                  # node id of the generator (OWN for ours)
    # span level (cross-tokenizer, align.py): span index of each completion token, and the
    # generator's summed log-prob of each span; both set -> the sample is span-level
    span_ids: list[int] | None = None
    gen_span_logprobs: list[float] | None = None

    @property
    def level(self) -> str:
        return "span" if self.span_ids is not None else "sequence" if self.sequence_level else "token"


def carries_signal(rewards: Sequence[float]) -> bool:
    """False when every reward of a group is equal: zero advantage, nothing to learn from it."""
    return len(rewards) > 0 and max(rewards) != min(rewards)
