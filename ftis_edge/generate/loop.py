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
        self._fit_context(len(prompt_ids) + sampler.max_new_tokens, n)
        ids = check_prompt(prompt_ids, self.n_vocab, sampler.max_new_tokens, self.n_ctx)
        rng = self._rng(sampler.seed)
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

    def _sample_batch(self, ids: list[int], k: int, sampler: SamplerSettings, rng,
                      stop: frozenset) -> list[Completion]:
        first = self._prefill_group(ids, k)
        return self._decode_rows([ids], [first], k, [sampler], [rng], stop)[0]

    def _decode_rows(self, prompts: list[list[int]], firsts: list, k: int, samplers: list[SamplerSettings],
                     rngs: list, stop: frozenset) -> list[list[Completion]]:
        """Decode k sequences per prompt until each stops; slot p * k + j is prompt p's j-th sequence.

        ``firsts[p]`` is the logits row after prompt p. Each prompt samples its rows with its own
        sampler and generator, in slot order, so several prompts decoded together give exactly the
        tokens each would get alone (for the same logits).
        """
        n_slots = len(prompts) * k
        owner = [s // k for s in range(n_slots)]
        tokens: list[list[int]] = [[] for _ in range(n_slots)]
        logps: list[list[float]] = [[] for _ in range(n_slots)]
        finish = ["length"] * n_slots
        raw: list[list[np.ndarray]] = [[] for _ in range(n_slots)]
        live = list(range(n_slots))
        logits = None                         # rows of the live slots, in slot order
        while True:
            if logits is None:                # every sequence of a prompt starts from the same row
                rows_of = {p: _repeat_rows(firsts[p], k) for p in range(len(prompts))}
            else:
                rows_of = {}
                for r, s in enumerate(live):
                    rows_of.setdefault(owner[s], []).append(r)
                rows_of = {p: logits[r[0]:r[-1] + 1] for p, r in rows_of.items()}   # contiguous per prompt
            still = []
            for p, block in rows_of.items():
                slots = [s for s in live if owner[s] == p]
                if self.record_logits:
                    for r, s in enumerate(slots):
                        raw[s].append(_host_row(block[r]))
                picked, picked_lp = _sample(block, samplers[p], rngs[p])
                for s, t, lp in zip(slots, picked, picked_lp):
                    tokens[s].append(t)
                    logps[s].append(lp)
                    if t in stop:
                        finish[s] = "stop"
                    elif len(tokens[s]) < samplers[p].max_new_tokens:
                        still.append(s)
            if not still:
                break
            live = still
            logits = self._decode_step(live, [tokens[s][-1] for s in live],
                                       [len(prompts[owner[s]]) + len(tokens[s]) - 1 for s in live])
        if self.record_logits:
            self.last_logits += [np.stack(r) for r in raw]
        eos = set(self.eos_token_ids)
        return [[Completion(token_ids=tokens[s], logprobs=logps[s],
                            text=self.detokenize([t for t in tokens[s] if t not in eos]),
                            finish_reason=finish[s], sampler=dict(samplers[p].as_dict()))
                 for s in range(p * k, (p + 1) * k)] for p in range(len(prompts))]

    # ------------------------------------------------------------------ many prompts at once
    def generate_many(self, prompts: Sequence[Sequence[int]], n: int,
                      samplers: Sequence[SamplerSettings]) -> list[list[Completion]]:
        """``n`` completions of each prompt (``samplers[i]`` for prompt i): the same completions as
        ``generate`` one prompt at a time. Backends with ``_prefill_many`` (llama.cpp) decode up to
        ``_batch_size`` sequences of several prompts together, their shared prefix decoded once."""
        if len(prompts) != len(samplers):
            raise GenerationError(f"{len(prompts)} prompts but {len(samplers)} sampler settings")
        per_wave = self._batch_size(n) // n if self._prefill_many is not None else 0
        if per_wave < 2:
            return [self.generate(p, n, s) for p, s in zip(prompts, samplers)]
        for s in samplers:
            check_sampler(s)
        ids = []
        for p, s in zip(prompts, samplers):
            self._fit_context(len(p) + s.max_new_tokens, n)
            ids.append(check_prompt(p, self.n_vocab, s.max_new_tokens, self.n_ctx))
        t0 = time.perf_counter()
        self.last_logits = []
        out: list[list[Completion]] = []
        with self._inference():
            for start in range(0, len(ids), per_wave):
                wave = ids[start:start + per_wave]
                firsts = self._prefill_many(wave, n)
                out += self._decode_rows(wave, firsts, n, list(samplers[start:start + per_wave]),
                                         [self._rng(s.seed) for s in samplers[start:start + per_wave]],
                                         frozenset(self.eos_token_ids))
        seconds = time.perf_counter() - t0
        n_tokens = sum(len(c.token_ids) for group in out for c in group)
        self.stats = {"tokens": n_tokens, "seconds": seconds, "tok_s": n_tokens / max(seconds, 1e-9),
                      "prompt_tokens": sum(len(p) for p in ids), "n": n * len(ids)}
        return out

    # a backend that can start sequences of several prompts at once sets this to a method
    # ``_prefill_many(prompts, k) -> [logits row after each prompt]`` (prompt p's sequences: slots p*k..)
    _prefill_many = None

    def _fit_context(self, tokens_per_sequence: int, n: int) -> None:
        """Make room for ``n`` sequences of this many tokens when the backend sizes its context."""

    def _rng(self, seed: int | None):
        """The random generator of one ``generate`` call (numpy; the HF backend: torch, on its device)."""
        return np.random.default_rng(seed)

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


def _sample(logits, sampler: SamplerSettings, rng) -> tuple[list[int], list[float]]:
    """Sample one token per row: numpy logits with the numpy sampler; torch logits (the HF backend)
    with the torch sampler, on their device; only the ids and log-probs come back to the host."""
    if isinstance(rng, np.random.Generator):
        picked, lp = sample_tokens(np.asarray(logits), sampler, rng)
        return picked.tolist(), lp.tolist()
    from .torch_sampling import sample_tokens_torch
    picked, lp = sample_tokens_torch(logits, sampler, rng)
    return picked.tolist(), lp.double().tolist()


def _repeat_rows(row, k: int):
    """k copies of one logits row: a numpy array or a torch tensor (a view, no copy)."""
    if isinstance(row, np.ndarray):
        return np.repeat(row[None], k, axis=0)
    return row[None].expand(k, -1)


def _host_row(row) -> np.ndarray:
    return np.array(row) if isinstance(row, np.ndarray) else row.float().cpu().numpy()
