"""The one interface every generation backend implements, and what callers pass to build one.

The log-prob contract (docs/bridge.md): ``Completion.logprobs[t]`` is the log-probability of
``token_ids[t]`` under the distribution it was actually sampled from (temperature applied,
top-k / top-p renormalised), so it can serve as the behaviour log-prob ``g`` in F-TIS. It is
kept in one place: the sampling loop of loop.py, which every backend shares.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

from ..errors import FtisError


class GenerationError(FtisError, ValueError):
    """Bad generation request (context overflow, bad token ids, bad sampler settings, unknown backend)."""


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


@dataclass(frozen=True)
class GeneratorOptions:
    """What a caller may ask of any backend (registry.create_generator); each backend uses what applies."""

    precision: str = "f16"          # llama.cpp weights: "f16" re-export (matches PyTorch) or "quantized"
    threads: int | None = None      # CPU threads (None: the backend's default)
    n_ctx: int | None = None        # llama.cpp: KV-cache context per sequence (default 2048); hf: the model's own
    max_group: int = 16             # llama.cpp: most sequences decoded together (size of a group)
    batch_rows: int | None = None   # hf: most sequences of several prompts decoded together (generate_many;
                                    #   None: hf.BATCH_ROWS, an in-run eval's 32 prompts in one batch)
    n_shared: int = 0               # llama.cpp: leading prompt tokens every sequence shares (an eval's system +
                                    #   few-shot prefix, stored once): a smaller cache (LlamaCppGenerator doc)
    policy: Any = None              # the learner's live torch model; hf samples from it (nothing to sync)
    adapter: str | None = None      # start with this adapter: GGUF LoRA file (llamacpp), peft folder (hf)


class Generator(Protocol):
    """A loaded model that samples groups of completions and takes the learner's new weights.

    Everything callers use is listed here (node, evaluate, sync, benchmarks); building one and
    checking an adapter path are class-level: ``GeneratorBackend`` below. tests/test_generate.py
    checks that every registered backend has each member.
    """

    backend: str                   # its name in registry.BACKENDS
    precision: str                 # weights it samples with ("f16", "quantized", "f32")
    eos_token_ids: list[int]       # tokens that end a completion (kept in token_ids, not in text)
    stop_texts: tuple[str, ...]    # texts that end a completion too (set_stop_texts)
    n_vocab: int                   # logits per position (token ids at or past it are refused)
    n_ctx: int                     # tokens a sequence may hold (prompt + completion)
    stats: dict                    # the last generate(): tokens, seconds, tok_s, prompt_tokens, n
    adapter_version: int | None    # learner version of the weights in use
    loads_weight_files: bool       # True: takes new weights from files sync.WeightSync writes
                                   #   (llama.cpp); False: samples from the learner's live model (hf)

    def generate(self, prompt_ids: Sequence[int], n: int, sampler: SamplerSettings, *,
                 ignore_eos: bool = False) -> list[Completion]:
        """Sample ``n`` completions of one prompt (a GRPO group)."""
        ...

    def generate_many(self, prompts: Sequence[Sequence[int]], n: int, samplers: Sequence[SamplerSettings],
                      on_done=None) -> list[list[Completion]]:
        """``n`` completions of each prompt (the same as ``generate`` one at a time); ``on_done(i,
        completions)`` as each prompt finishes."""
        ...

    def set_stop_texts(self, texts: Sequence[str], tokenizer=None) -> None:
        """End sequences at these texts too (a base model's next plain-format turn; stops.py)."""
        ...

    def score(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]],
              temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> list:
        """Per-token log-probs (numpy arrays) of given completions under the current weights."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        ...

    def set_adapter(self, path: str | None, version: int) -> None:
        """Use the given adapter (or none); subsequent samples come from that policy."""
        ...

    def sync_weights(self, exporter, version: int) -> dict:
        """Take the learner's policy at ``version`` (sync.WeightSync is the exporter); returns sync/* metrics."""
        ...

    def close(self) -> None:
        ...


class GeneratorBackend(Protocol):
    """The class a registry entry names: how to build one, and the facts about it that the rest of
    the package asks (preflight, fit, evaluate, the device pick) instead of comparing its name."""

    backend: str
    loads_weight_files: bool       # known before building one (sync.WeightSync.from_bundle asks)
    gguf_weights: bool             # samples from GGUF files (a run directory's weights are its to evaluate)
    lora_targets: tuple[str, ...] | None   # the only layers its LoRA adapters can hold (None: any)
    weight_precisions: tuple[str, ...]     # the model.precision values it samples with
    context_limit: int | None      # tokens per sequence a node's generator is held to (None: no fixed one)
    memory_on_learner_device: bool     # its memory sits on the learner's device (else in RAM)

    def create(self, bundle, options: GeneratorOptions) -> Generator:
        """Build it on a ``models.ModelBundle`` (a classmethod)."""
        ...

    def adapter_problem(self, path) -> str | None:
        """Why ``path`` is not an adapter this backend can load, or None (a staticmethod)."""
        ...

    def model_problem(self, bundle) -> str | None:
        """Why it cannot sample from ``bundle``, or None (a staticmethod)."""
        ...

    def lora_problem(self, targets) -> str | None:
        """Why LoRA on ``targets`` cannot reach it, or None (a staticmethod)."""
        ...

    def gpu_problem(self, device: str) -> str | None:
        """Why it cannot run where the learner runs (``device``), or None."""
        ...

    def memory(self, shape, setup, kv_cells: int) -> dict:
        """learn/fit.py: bytes it holds at a node's peak, per part (a staticmethod)."""
        ...
