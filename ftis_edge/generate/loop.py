"""The sampling loop every backend shares: prefill once, then one token per live sequence per step.

A backend supplies the model steps (below, "backend steps") and nothing else: logits for the
prompt, logits for the next position of a batch of sequences, logits for given completions.
This loop does the rest once for all backends: sampling from the processed distribution
(sampling.py), the exact behaviour log-prob of each sampled token, end-of-sequence and length
stops, seeding (one numpy generator per ``generate`` call, consumed row by row in slot order),
text, stats. A finished sequence drops out of the batch.

EOS convention: the end-of-generation token that stopped a sequence IS included in
``token_ids`` and ``logprobs`` (it was sampled, and it is what teaches the policy to stop);
``text`` excludes it. A stop text (stops.py: a base model's next plain-format turn) ends a
sequence the same way; its tokens stay in ``token_ids`` and its text in ``text``.
"""
from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np

from .base import Completion, GenerationError, SamplerSettings
from .sampling import check_prompt, check_sampler, sample_tokens, token_logprobs
from .stops import StopRule


class SamplingGenerator:
    """Base class of the backends: ``generate`` and ``score`` over the backend steps.

    Subclasses set ``backend``, ``precision``, ``n_vocab``, ``n_ctx`` and ``eos_token_ids`` and
    implement the backend steps ``_batch_size``, ``_prefill_group``, ``_decode_step``,
    ``_completion_logits`` and ``detokenize`` (``_inference`` when the model needs a mode).
    """

    backend = ""
    precision = ""
    loads_weight_files = True      # base.Generator: new weights arrive as files (hf: False)

    def __init__(self):
        self.adapter_path: str | None = None
        self.adapter_version: int | None = None
        self.stats: dict = {}
        self.record_logits = False          # debug/test hook: keep each step's raw logits
        self.last_logits: list[np.ndarray] = []
        self.stop_texts: tuple[str, ...] = ()
        self._token_bytes = None

    def set_stop_texts(self, texts: Sequence[str], tokenizer=None) -> None:
        """End sequences at these texts too (``ModelBundle.stop_texts``); needs the tokenizer."""
        self.stop_texts = tuple(t for t in texts if t)
        if self.stop_texts and self._token_bytes is None:
            from ..rollout.align import TokenBytes
            self._token_bytes = TokenBytes(tokenizer)

    def _stop_rule(self, ignore_eos: bool = False) -> StopRule:
        if ignore_eos:
            return StopRule(())
        return StopRule(self.eos_token_ids, self.stop_texts, self._token_bytes)

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
        stop = self._stop_rule(ignore_eos)
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
                      stop: StopRule) -> list[Completion]:
        first = self._prefill_group(ids, k)
        return self._decode_rows([ids], [first], k, [sampler], [rng], stop)[0]

    def _decode_rows(self, prompts: list[list[int]], firsts: list, k: int, samplers: list[SamplerSettings],
                     rngs: list, stop: StopRule) -> list[list[Completion]]:
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
                    if stop.ends(tokens[s]):
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
        return [self._completions(tokens[p * k:(p + 1) * k], logps[p * k:(p + 1) * k],
                                  finish[p * k:(p + 1) * k], samplers[p]) for p in range(len(prompts))]

    # ------------------------------------------------------------------ many prompts at once
    def generate_many(self, prompts: Sequence[Sequence[int]], n: int, samplers: Sequence[SamplerSettings],
                      on_done=None) -> list[list[Completion]]:
        """``n`` completions of each prompt (``samplers[i]`` for prompt i): the same completions as
        ``generate`` one prompt at a time. Backends with the pool steps (llama.cpp) keep up to
        ``_pool_slots`` sequences (at most ``_batch_size(n)``, as many as the cache surely holds)
        of several prompts decoding together, their shared prefix decoded once, and start the next
        prompt in a slot as soon as a sequence finishes (continuous batching: a long answer no
        longer holds a whole wave of short ones). Backends with the batch steps (hf) decode up to
        ``_batch_rows`` sequences of several prompts together in fixed batches, the shared prefix
        decoded once per batch. An empty prompt list or a prompt over the context is an error.
        ``on_done(i, completions)`` is called as each prompt finishes (progress bars, grading)."""
        if len(prompts) != len(samplers):
            raise GenerationError(f"{len(prompts)} prompts but {len(samplers)} sampler settings")
        for s in samplers:
            check_sampler(s)
        if n < 1:
            raise GenerationError(f"n must be >= 1, got {n}")
        if not prompts:
            raise GenerationError("no prompts to generate for (an empty prompt list)")
        ids = []
        for i, (p, s) in enumerate(zip(prompts, samplers)):
            self._fit_context(len(p) + s.max_new_tokens, n)
            try:
                ids.append(check_prompt(p, self.n_vocab, s.max_new_tokens, self.n_ctx))
            except GenerationError as e:
                raise GenerationError(f"prompt {i + 1} of {len(prompts)}: {e}") from None
        samplers = list(samplers)
        shared = shared_prefix_len(ids)
        n_slots = 0
        if self._pool_start is not None and self._batch_size(n) // n >= 2:
            n_slots = self._pool_slots(n, shared, max(len(p) - shared + s.max_new_tokens for p, s in zip(ids, samplers)))
        if self._batch_start is not None and shared >= 1 and self._batch_rows // n >= 2:
            decode = lambda: self._decode_batches(ids, n, samplers, on_done, self._batch_rows // n)  # noqa: E731
        elif n_slots // n >= 2:               # else the cache holds one prompt's sequences at a time
            decode = lambda: self._decode_pool(ids, n, samplers, on_done, n_slots, shared)  # noqa: E731
        else:
            decode = lambda: self._one_at_a_time(ids, n, samplers, on_done)  # noqa: E731
        return self._timed(ids, n, decode)

    def _timed(self, ids: list[list[int]], n: int, decode) -> list[list[Completion]]:
        """Run ``decode()`` in inference mode; ``stats`` of all its prompts together."""
        t0 = time.perf_counter()
        self.last_logits = []
        with self._inference():
            out = decode()
        seconds = time.perf_counter() - t0
        n_tokens = sum(len(c.token_ids) for group in out for c in group)
        self.stats = {"tokens": n_tokens, "seconds": seconds, "tok_s": n_tokens / max(seconds, 1e-9),
                      "prompt_tokens": sum(len(p) for p in ids), "n": n * len(ids)}
        return out

    def _decode_batches(self, prompts: list[list[int]], k: int, samplers: list[SamplerSettings], on_done,
                        per_batch: int) -> list[list[Completion]]:
        """Static batching for a backend with the batch steps (hf): ``per_batch`` prompts at a
        time, their shared prefix decoded once, each batch decoded until all its sequences stop.
        Each prompt samples with its own sampler and generator in slot order (``_decode_rows``),
        so it gets the tokens it would get alone (for the same logits)."""
        stop = self._stop_rule()
        out: list[list[Completion]] = []
        for start in range(0, len(prompts), per_batch):
            chunk, chunk_samplers = prompts[start:start + per_batch], samplers[start:start + per_batch]
            firsts = self._batch_start(chunk, k, shared_prefix_len(chunk))
            groups = self._decode_rows(chunk, firsts, k, chunk_samplers,
                                       [self._rng(s.seed) for s in chunk_samplers], stop)
            for i, group in enumerate(groups):
                if on_done:
                    on_done(start + i, group)
            out += groups
        return out

    def _one_at_a_time(self, prompts, n: int, samplers, on_done) -> list[list[Completion]]:
        out, logits = [], []
        for i, (p, s) in enumerate(zip(prompts, samplers)):
            out.append(self.generate(p, n, s))
            logits += self.last_logits            # generate keeps only its own
            if on_done:
                on_done(i, out[-1])
        self.last_logits = logits
        return out

    def _decode_pool(self, prompts: list[list[int]], k: int, samplers: list[SamplerSettings],
                     on_done, n_slots: int, shared: int) -> list[list[Completion]]:
        """Continuous batching over a pool of ``n_slots`` sequence slots, the first ``shared``
        tokens of every prompt decoded once.

        A prompt enters when k slots are free (in prompt order); its sequence j samples from the
        rows of its live sequences in j order with the prompt's own generator, exactly as
        ``generate`` does, so each prompt gets the tokens it would get alone (for the same logits).
        A finished sequence frees its slot at once. Each step is one backend call that feeds the
        next token of every live sequence and the own tail of every entering prompt.
        """
        self._pool_start(prompts[0][:shared])
        stop = self._stop_rule()
        free = list(range(n_slots))
        waiting = list(range(len(prompts)))[::-1]            # pop() takes the next prompt
        slots_of: dict[int, list[int]] = {}                  # prompt -> its k slots, in j order
        tokens: dict[int, list[list[int]]] = {}
        logps: dict[int, list[list[float]]] = {}
        finish: dict[int, list[str]] = {}
        live_of: dict[int, list[int]] = {}                   # prompt -> its live j's, in order
        rngs: dict[int, object] = {}
        raw: dict[int, list[list]] = {}
        results: list = [None] * len(prompts)
        rows_of: dict[int, object] = {}                      # prompt -> logits rows of its live j's
        while True:
            # sample every active prompt's live sequences; collect the next feeds
            feeds: list[tuple[int, int, int]] = []            # (slot, token, position)
            feed_owner: list[tuple[int, int]] = []             # (prompt, j) of each feed
            for p, block in rows_of.items():
                live = live_of[p]
                if self.record_logits:
                    for r, j in enumerate(live):
                        raw[p][j].append(_host_row(block[r]))
                picked, picked_lp = _sample(block, samplers[p], rngs[p])
                still = []
                for j, t, lp in zip(live, picked, picked_lp):
                    tokens[p][j].append(t)
                    logps[p][j].append(lp)
                    if stop.ends(tokens[p][j]):
                        finish[p][j] = "stop"
                    elif len(tokens[p][j]) < samplers[p].max_new_tokens:
                        still.append(j)
                        continue
                    self._pool_release(slots_of[p][j])
                    free.append(slots_of[p][j])
                live_of[p] = still
                for j in still:
                    feeds.append((slots_of[p][j], tokens[p][j][-1], len(prompts[p]) + len(tokens[p][j]) - 1))
                    feed_owner.append((p, j))
                if not still:
                    results[p] = self._completions(tokens[p], logps[p], finish[p], samplers[p])
                    if on_done:
                        on_done(p, results[p])
            # let waiting prompts into the free slots
            free.sort()
            entering = []
            while waiting and len(free) >= k:
                p = waiting.pop()
                slots_of[p], free = free[:k], free[k:]
                tokens[p], logps[p] = [[] for _ in range(k)], [[] for _ in range(k)]
                finish[p], live_of[p], raw[p] = ["length"] * k, list(range(k)), [[] for _ in range(k)]
                rngs[p] = self._rng(samplers[p].seed)
                entering.append(p)
            if not feeds and not entering:
                break
            step_rows, first_rows = self._pool_step(
                feeds, [(prompts[p][shared:], shared, slots_of[p]) for p in entering])
            rows_of = {}
            for r, (p, j) in enumerate(feed_owner):            # a prompt's feeds are contiguous
                if p not in rows_of:
                    rows_of[p] = step_rows[r:r + len(live_of[p])]
            for p, first in zip(entering, first_rows):
                rows_of[p] = _repeat_rows(first, k)
        if self.record_logits:
            self.last_logits = [np.stack(r) for p in range(len(prompts)) for r in raw[p]]
        return results

    def _completions(self, tokens: list[list[int]], logps: list[list[float]], finish: list[str],
                     sampler: SamplerSettings) -> list[Completion]:
        eos = set(self.eos_token_ids)
        return [Completion(token_ids=t, logprobs=lp, text=self.detokenize([x for x in t if x not in eos]),
                           finish_reason=f, sampler=dict(sampler.as_dict()))
                for t, lp, f in zip(tokens, logps, finish)]

    # A backend that can keep sequences of several prompts in one batch sets these to methods:
    #   _pool_start(prefix_ids): forget all sequences, decode the prefix every prompt shares
    #   _pool_step(feeds, entering) -> (rows, first_rows): one model call that feeds each
    #       (slot, token, position) of ``feeds`` (rows: their next-token logits, in order) and
    #       starts each (tail_ids, start_position, slots) of ``entering`` on the shared prefix +
    #       tail (first_rows: the logits after each tail's last token)
    #   _pool_release(slot): forget a finished sequence
    _pool_start = None
    _pool_step = None
    _pool_release = None
    # A backend that decodes several prompts together in fixed batches (hf) sets instead:
    #   _batch_start(prompts, k, shared) -> first_rows: start k sequences of each prompt (slot
    #       p * k + j), the first ``shared`` tokens (>= 1, every prompt longer) decoded once; the
    #       logits after each prompt's last token. ``_decode_step`` then serves those slots.
    #   _batch_rows: the most sequences one such batch holds
    _batch_start = None
    _batch_rows = 0

    def _pool_slots(self, k: int, shared: int, per_slot: int) -> int:
        """How many pool slots to use when each may need ``per_slot`` tokens beyond the ``shared``
        prefix (a backend whose cache is sized by tokens caps this at what its cache holds)."""
        return self._batch_size(k)

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


def shared_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens the pool decodes once for all ``prompts``: their common prefix,
    less one token where a prompt would be all prefix (each prompt decodes a tail of its own)."""
    return min(_common_prefix(prompts), min(len(p) for p in prompts) - 1)


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest token prefix all prompts share."""
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        t = first[i]
        if any(p[i] != t for p in prompts):
            return i
    return n


def _repeat_rows(row, k: int):
    """k copies of one logits row: a numpy array or a torch tensor (a view, no copy)."""
    if isinstance(row, np.ndarray):
        return np.repeat(row[None], k, axis=0)
    return row[None].expand(k, -1)


def _host_row(row) -> np.ndarray:
    return np.array(row) if isinstance(row, np.ndarray) else row.float().cpu().numpy()
