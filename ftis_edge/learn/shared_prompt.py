"""The prompt once per group: its keys/values are computed once and reused by every completion that shares it.

A GRPO group is G completions of one prompt, and the prompt (system text + few-shot examples) is the
longest part of every sequence. Instead of G forward/backward passes over prompt + completion, the
decoder runs the prompt once and the completions run as one batch on top of its KV cache, expanded over
the rows with ``index_select`` — whose backward sums the rows' gradients, so the prompt receives the
whole group's gradient, exactly as G separate copies would.

A micro-batch may hold completions of several prompts (the end of one group, the start of the next;
peers' groups): shorter prompts are left-padded in the cache and masked out. Position ids are given
explicitly, so RoPE positions, causality and sliding windows are those of each unpadded sequence.

When a prompt's completions span several micro-batches, ``PromptPass`` keeps the prompt's graph
alive and hands each micro-batch detached leaf copies of its states; after the last micro-batch the
leaves' accumulated gradients are pushed back through the prompt forward once (``finish``).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


@dataclass
class PromptState:
    """What the completions need from their prompt: the per-layer keys/values and the last hidden state."""
    kv: list[tuple[torch.Tensor, torch.Tensor]]   # per layer, each [1, kv_heads, P, head_dim]
    last: torch.Tensor                            # [hidden]: predicts the first completion token
    length: int                                   # P

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in self.kv for t in pair] + [self.last]


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; earlier ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))       # older transformers


def run_prompt(decoder, prompt_ids: Sequence[int], device: torch.device) -> PromptState:
    """The decoder over one prompt (with grad when enabled): its KV cache and last hidden state."""
    from transformers import DynamicCache

    ids = torch.tensor([list(prompt_ids)], device=device)
    # A cache without the config: every layer keeps all P positions (a sliding-window layer's cache
    # would keep only the last window, which left-padding across prompts cannot line up).
    cache = DynamicCache()
    out = decoder(input_ids=ids, use_cache=True, **{cache_kwarg(decoder): cache})
    return PromptState(kv=_cache_layers(cache), last=out.last_hidden_state[0, -1], length=len(prompt_ids))


def completion_hidden(decoder, rows: Sequence[tuple[PromptState, Sequence[int]]],
                      device: torch.device) -> torch.Tensor:
    """Hidden states that predict each row's completion tokens: [rows, longest completion, hidden].

    ``out[b, j]`` predicts token j of row b's completion (j = 0 comes from the prompt's last position).
    Rows are right-padded; positions past a row's completion hold garbage and must be masked by the caller.
    """
    from transformers import DynamicCache

    prompts: list[PromptState] = []
    which: list[int] = []
    for state, _ in rows:
        for k, p in enumerate(prompts):
            if p is state:
                break
        else:
            k = len(prompts)
            prompts.append(state)
        which.append(k)
    p_max = max(p.length for p in prompts)
    c_max = max(len(c) for _, c in rows)
    n_rows = len(rows)
    index = torch.tensor(which, device=device)

    cache = DynamicCache()
    n_layers = len(prompts[0].kv)
    for layer in range(n_layers):
        # left-pad each prompt's keys/values to p_max, stack the distinct prompts, expand over the rows
        keys = torch.cat([F.pad(p.kv[layer][0], (0, 0, p_max - p.length, 0)) for p in prompts])
        values = torch.cat([F.pad(p.kv[layer][1], (0, 0, p_max - p.length, 0)) for p in prompts])
        cache.update(keys.index_select(0, index), values.index_select(0, index), layer)

    input_ids = torch.zeros(n_rows, c_max, dtype=torch.long)
    attention = torch.zeros(n_rows, p_max + c_max, dtype=torch.long)
    positions = torch.zeros(n_rows, c_max, dtype=torch.long)
    for b, (state, comp) in enumerate(rows):
        input_ids[b, :len(comp)] = torch.tensor(list(comp))
        attention[b, p_max - state.length:p_max + len(comp)] = 1
        positions[b] = torch.arange(state.length, state.length + c_max)
    out = decoder(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                  position_ids=positions.to(device), use_cache=True, **{cache_kwarg(decoder): cache})
    firsts = torch.stack([p.last for p in prompts]).index_select(0, index)       # [rows, hidden]
    # out.last_hidden_state[:, j] predicts completion token j + 1; the last column predicts nothing
    return torch.cat([firsts[:, None, :].to(out.last_hidden_state.dtype), out.last_hidden_state[:, :-1]], dim=1)


class PromptPass:
    """One prompt's forward, kept until all of its completions (across micro-batches) are done.

    ``leaves`` is what the micro-batches use: detached copies that collect gradients when grad is on
    (the prompt's own outputs when it is off). ``finish()`` back-propagates the collected gradients
    through the prompt forward once.
    """

    def __init__(self, decoder, prompt_ids: Sequence[int], device: torch.device, remaining: int):
        self.graph = run_prompt(decoder, prompt_ids, device)
        self.remaining = remaining
        if torch.is_grad_enabled():
            def leaf(t):
                return t.detach().requires_grad_(True)
            self.leaves = PromptState(kv=[(leaf(k), leaf(v)) for k, v in self.graph.kv],
                                      last=leaf(self.graph.last), length=self.graph.length)
        else:
            self.leaves = self.graph

    def finish(self) -> None:
        """Back-propagate the micro-batches' gradients through the prompt forward (no-op without grad)."""
        if self.leaves is self.graph:
            return
        pairs = [(out, leaf.grad) for out, leaf in zip(self.graph.tensors(), self.leaves.tensors())
                 if leaf.grad is not None and out.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.graph = self.leaves = None


def prompt_key(prompt_ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in prompt_ids)


def plan_micro_batches(prompts: Sequence[Sequence[int]], completion_lengths: Sequence[int],
                       micro_batch: int) -> list[list[int]]:
    """Sample indices in micro-batches of at most ``micro_batch``, each prompt's samples contiguous.

    Groups are ordered by prompt length and each group's samples by completion length, so a
    micro-batch that spans two groups pads little, and a group split over micro-batches pads little.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(prompt_key(p), []).append(i)
    order = [i for key in sorted(groups, key=len)
             for i in sorted(groups[key], key=lambda i: completion_lengths[i])]
    return [order[i:i + micro_batch] for i in range(0, len(order), micro_batch)]


# A forward pass costs about this many padded completion tokens on top of its rows: per-layer Python
# plus small matmuls' lower rate (a 50-row matmul runs at ~0.8x a 500-row one). 32 took 0.965x the
# CPU seconds of 8 on the real rollouts (bench_learner --bucket-overhead 8 32 48, docs/benchmarks.md)
# but is not used: its padded forwards move the micro-batch-1-vs-4 gradient by 1.04e-4 relative, past
# the equivalence test's 1e-4 (tests/test_learner.py), which Speed III keeps unchanged.
BUCKET_OVERHEAD_TOKENS = 8


def length_buckets(lengths: Sequence[int], overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[list[int]]:
    """Split rows sorted by ascending length into consecutive buckets, one forward each, minimising
    padded tokens (rows x the bucket's longest) + ``overhead`` per forward.

    A group's completions often range from a few tokens to the cap (128): one right-padded forward
    would compute ~2x the real tokens; a few buckets compute close to the real ones.
    """
    n = len(lengths)
    if any(lengths[i] > lengths[i + 1] for i in range(n - 1)):
        raise ValueError("length_buckets needs lengths in ascending order")
    best = [0.0] + [math.inf] * n           # best[j]: cost of the first j rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):                  # rows i..j-1 in one bucket, padded to lengths[j-1]
            cost = best[i] + (j - i) * lengths[j - 1] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        out.append(list(range(cut[j], j)))
        j = cut[j]
    return out[::-1]
