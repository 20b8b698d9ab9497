"""The one interface every generation backend implements.

The log-prob contract (docs/bridge.md): ``Completion.logprobs[t]`` is the log-probability of
``token_ids[t]`` under the distribution it was actually sampled from (temperature applied,
top-k / top-p renormalised), so it can serve as the behaviour log-prob ``g`` in F-TIS.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 1.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1.0 = off
    max_new_tokens: int = 128
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]          # behaviour log-prob of each sampled token (see module doc)
    text: str
    finish_reason: str             # "stop" (end-of-sequence token) or "length"
    sampler: dict = field(default_factory=dict)


class Generator(Protocol):
    """A loaded model that samples groups of completions."""

    backend: str                   # "llamacpp" | "hf"

    def generate(self, prompt_ids: Sequence[int], n: int,
                 sampler: SamplerSettings) -> list[Completion]:
        """Sample ``n`` completions of one prompt (a GRPO group)."""
        ...

    def set_adapter(self, path: str | None, version: int) -> None:
        """Use the given adapter (or none); subsequent samples come from that policy."""
        ...

    def close(self) -> None:
        ...
