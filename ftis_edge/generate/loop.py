"""The sampling loop every backend shares: prefill once, then one token per live sequence per step.

A backend supplies the model steps (below, "backend steps") and nothing else: logits for the
prompt, logits for the next position of a batch of sequences, logits for given completions.
This loop does the rest once for all backends: sampling from the processed distribution
(sampling.py), the exact behaviour log-prob of each sampled token, end-of-sequence and length
stops, seeding (one numpy generator per ``generate`` call, consumed row by row in slot order),
text, stats. A finished sequence drops out of the batch.

EOS convention: the end-of-generation token that stopped a sequence IS included in
``token_ids`` and ``logprobs`` (it was sampled, and it is what teaches the policy to stop);
``text`` excludes it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np

from .base import Completion, GenerationError, SamplerSettings
from .sampling import check_prompt, check_sampler, sample_tokens, token_logprobs


class SamplingGenerator:
    """Base class of the backends: ``generate`` and ``score`` over the backend steps.

    Subclasses set ``backend``, ``precision``, ``n_vocab``, ``n_ctx`` and ``eos_token_ids`` and
    implement the backend steps ``_batch_size``, ``_prefill_group``, ``_decode_step``,
    ``_completion_logits`` and ``detokenize`` (``_inference`` when the model needs a mode).
    """

    backend = ""
    precision = ""

    def __init__(self):
        self.adapter_path: str | None = None
        self.adapter_version: int | None = None
        self.stats: dict = {}
        self.record_logits = False          # debug/test hook: keep each step's raw logits
        self.last_logits: list[np.ndarray] = []

    @property
    def tok_s(self) -> float:
        return self.stats.get("tok_s", 0.0)

    # ------------------------------------------------------------------ backend steps
    def _batch_size(self, n: int) -> int:
        """How many of a group's n sequences decode together (the rest follow in later batches)."""
        raise NotImplementedError

    def _prefill_group(self, ids: list[int], k: int) -> np.ndarray:
        """Start k sequences on the prompt ``ids``; the logits (vocab,) after its last token."""
        raise NotImplementedError

    def _decode_step(self, slots: list[int], tokens: list[int], positions: list[int]) -> np.ndarray:
        """Feed ``tokens[j]`` at ``positions[j]`` to sequence ``slots[j]`` (the live ones, in slot
        order; a slot missing since the last step has finished); logits (len(slots), vocab)."""
        raise NotImplementedError

    def _completion_logits(self, ids: list[int], completions: list[list[int]]) -> list[np.ndarray]:
        """For each completion, the logits (len(c), vocab) that predict its tokens (anything for an empty one)."""
        raise NotImplementedError

    def detokenize(self, token_ids: Sequence[int]) -> str:
        raise NotImplementedError

    def _inference(self):
        """Context for model calls (the HF backend: eval mode, no autograd)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids: Sequence[int], n: int, sampler: SamplerSettings, *,
                 ignore_eos: bool = False) -> list[Completion]:
        """Sample ``n`` completions of one prompt, in batches of ``_batch_size(n)``.

        ``ignore_eos`` forces every completion to max_new_tokens (benchmarks only).
        """
        check_sampler(sampler)
        if n < 1:
            raise GenerationError(f"n must be >= 1, got {n}")
        ids = check_prompt(prompt_ids, self.n_vocab, sampler.max_new_tokens, self.n_ctx)
        rng = np.random.default_rng(sampler.seed)
        stop = frozenset(() if ignore_eos else self.eos_token_ids)
        t0 = time.perf_counter()
        self.last_logits = []
        out: list[Completion] = []
        with self._inference():
            step = self._batch_size(n)
            for start in range(0, n, step):
                out += self._sample_batch(ids, min(step, n - start), sampler, rng, stop)
        seconds = time.perf_counter() - t0
        n_tokens = sum(len(c.token_ids) for c in out)
        self.stats = {"tokens": n_tokens, "seconds": seconds, "tok_s": n_tokens / max(seconds, 1e-9),
                      "prompt_tokens": len(ids), "n": n}
        return out

    def _sample_batch(self, ids: list[int], k: int, sampler: SamplerSettings, rng: np.random.Generator,
                      stop: frozenset) -> list[Completion]:
        first = self._prefill_group(ids, k)
        logits = np.repeat(first[None], k, axis=0)        # every sequence starts from the same row
        tokens: list[list[int]] = [[] for _ in range(k)]
        logps: list[list[float]] = [[] for _ in range(k)]
        finish = ["length"] * k
        raw: list[list[np.ndarray]] = [[] for _ in range(k)]
        live = list(range(k))
        while True:
            if self.record_logits:
                for r, s in enumerate(live):
                    raw[s].append(np.array(logits[r]))
            picked, picked_lp = sample_tokens(logits, sampler, rng)
            still = []
            for s, t, lp in zip(live, picked.tolist(), picked_lp.tolist()):
                tokens[s].append(t)
                logps[s].append(lp)
                if t in stop:
                    finish[s] = "stop"
                elif len(tokens[s]) < sampler.max_new_tokens:
                    still.append(s)
            if not still:
                break
            live = still
            logits = self._decode_step(live, [tokens[s][-1] for s in live],
                                       [len(ids) + len(tokens[s]) - 1 for s in live])
        if self.record_logits:
            self.last_logits += [np.stack(r) for r in raw]
        eos = set(self.eos_token_ids)
        settings = sampler.as_dict()
        return [Completion(token_ids=tokens[s], logprobs=logps[s],
                           text=self.detokenize([t for t in tokens[s] if t not in eos]),
                           finish_reason=finish[s], sampler=dict(settings)) for s in range(k)]

    # ------------------------------------------------------------------ scoring
    def score(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]],
              temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> list[np.ndarray]:
        """Per-token log-probs of given completions under the current weights.

        With the defaults this is the raw-logit log-softmax; pass the sampler's settings to get the
        processed distribution.
        """
        ids = check_prompt(prompt_ids, self.n_vocab, 0, self.n_ctx)
        comps = [list(map(int, c)) for c in completions]
        for c in comps:
            check_prompt(c or [0], self.n_vocab, 0, self.n_ctx - len(ids))
        with self._inference():
            rows = self._completion_logits(ids, comps)
        return [token_logprobs(r, c, temperature, top_k, top_p) if c else np.zeros(0) for r, c in zip(rows, comps)]
