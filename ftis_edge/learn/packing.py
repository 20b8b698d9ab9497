"""A micro-batch's completions packed into rows behind their shared prompts: one forward, next to no padding.

The bucketed path (``shared_prompt.completion_hidden`` over ``length_buckets``) runs a group's
completions of 18-128 tokens as 1-5 right-padded forwards: padding, and per-layer Python plus small
matmuls once per bucket. Here every completion's input tokens (all but its last: the last predicts
nothing) are laid end to end in rows as wide as the longest one (first-fit decreasing: a long
completion fills a row alone, short ones share one), and the whole micro-batch is ONE forward.

Each row's cache holds the micro-batch's distinct prompts' keys/values side by side (each prompt
once, computed once per group: ``shared_prompt``). A dense block-diagonal mask lets a token see
exactly its own prompt and the earlier tokens of its own completion; position ids restart at the
prompt's length for each completion, so RoPE, causality and sliding windows (applied here on the
true positions) are those of the sequence alone. The log-probs equal the per-sample ones up to the
float rounding of other matrix shapes. (On the CPU FlexAttention has no backward and nested tensors
refuse a causal mask: a dense mask over short rows is the path that works; each row's attention is
W x (prompts + W), as wide as an unpacked row's.)
"""
from __future__ import annotations

from typing import Sequence

import torch

from .shared_prompt import PromptState, cache_kwarg

PACKABLE_ATTENTION = ("sdpa", "eager")     # take a custom 4-D mask as given (flash kernels do not)


def packable(decoder) -> bool:
    """The decoder's attention takes a dense custom mask (sdpa, eager)."""
    return getattr(decoder.config, "_attn_implementation", None) in PACKABLE_ATTENTION


def pack_rows(lengths: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
    """First-fit decreasing: (row width W = the longest length, (row, offset) per length).

    Deterministic (ties keep their order), so a resumed run packs the same rows."""
    width = max(lengths, default=0)
    fill: list[int] = []
    place: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n == 0:
            continue
        for r, used in enumerate(fill):
            if used + n <= width:
                break
        else:
            r = len(fill)
            fill.append(0)
        place[i] = (r, fill[r])
        fill[r] += n
    return width, place


def _layer_windows(config) -> dict[str, int | None]:
    """Layer kind -> its window on the true positions (None: full causal). Several kinds (Gemma 3's
    sliding and full layers) go to the model as a dict by kind; one kind as a tensor (key "")."""
    window = getattr(config, "sliding_window", None)
    kinds = set(getattr(config, "layer_types", None) or ())
    if len(kinds) > 1:
        return {kind: (window if kind == "sliding_attention" else None) for kind in kinds}
    if kinds == {"full_attention"} or getattr(config, "use_sliding_window", True) is False:
        window = None
    return {"": window}


def packed_hidden(decoder, rows: Sequence[tuple[PromptState, Sequence[int]]], device: torch.device) -> torch.Tensor:
    """Hidden states that predict every completion token, flat: [sum of completion lengths, hidden],
    row b's token j at ``sum(len(c) for earlier rows) + j``. Token 0 comes from the prompt's last
    position; the others from the packed forward."""
    from transformers import DynamicCache

    prompts: list[PromptState] = []
    which: list[int] = []
    for state, _ in rows:
        k = next((i for i, p in enumerate(prompts) if p is state), None)
        if k is None:
            k = len(prompts)
            prompts.append(state)
        which.append(k)
    starts = [0]
    for p in prompts:
        starts.append(starts[-1] + p.length)
    inputs = [list(c)[:-1] for _, c in rows]                 # the last token predicts nothing
    width, place = pack_rows([len(x) for x in inputs])
    lasts = torch.stack([p.last for p in prompts])             # [prompts, hidden]
    index = []                                                 # where each completion token's predictor lies
    for b, x in enumerate(inputs):
        r, o = place[b]
        index.append(which[b])
        index += range(len(prompts) + r * width + o, len(prompts) + r * width + o + len(x))
    if width == 0:                                             # every completion is one token long
        return lasts.index_select(0, torch.tensor(index, device=lasts.device))

    n_rows = 1 + max(r for (r, _), x in zip(place, inputs) if x)
    ids = torch.zeros(n_rows, width, dtype=torch.long)
    owner = torch.full((n_rows, width), -1, dtype=torch.long)   # sample index; -1 a pad
    pos = torch.arange(width).repeat(n_rows, 1)                 # a pad's position: its own column
    for b, x in enumerate(inputs):
        r, o = place[b]
        ids[r, o:o + len(x)] = torch.tensor(x, dtype=torch.long)
        owner[r, o:o + len(x)] = b
        pos[r, o:o + len(x)] = torch.arange(prompts[which[b]].length, prompts[which[b]].length + len(x))
    masks = _masks(owner, pos, torch.tensor(which), starts, _layer_windows(decoder.config),
                   getattr(decoder.config, "_attn_implementation", "sdpa") == "sdpa")

    cache = DynamicCache()
    for layer in range(len(prompts[0].kv)):
        keys = torch.cat([p.kv[layer][0] for p in prompts], dim=2)       # [1, kv_heads, P_tot, head_dim]
        values = torch.cat([p.kv[layer][1] for p in prompts], dim=2)
        cache.update(keys.expand(n_rows, -1, -1, -1), values.expand(n_rows, -1, -1, -1), layer)
    masks = {k: m.to(device) for k, m in masks.items()}
    mask = masks[""] if "" in masks else masks
    out = decoder(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device), use_cache=True,
                  **{cache_kwarg(decoder): cache}).last_hidden_state           # [rows, W, hidden]
    flat = torch.cat([lasts.to(out.dtype), out.reshape(n_rows * width, -1)])
    return flat.index_select(0, torch.tensor(index, device=flat.device))


def _masks(owner: torch.Tensor, pos: torch.Tensor, which: torch.Tensor, starts: list[int],
           windows: dict[str, int | None], boolean: bool) -> dict[str, torch.Tensor]:
    """Per attention kind, the [rows, 1, W, P_tot + W] mask: a token sees its own prompt's keys and the
    earlier tokens of its own completion (a pad only the pads before it, so no row of the softmax is
    empty), within the kind's window on the true positions. Boolean (True = attend) for sdpa, additive
    float for eager attention."""
    lengths = torch.tensor(starts[1:]) - torch.tensor(starts[:-1])
    key_prompt = torch.repeat_interleave(torch.arange(len(lengths)), lengths)         # [P_tot]
    key_ppos = torch.arange(starts[-1]) - torch.tensor(starts[:-1]).repeat_interleave(lengths)
    q_prompt = torch.where(owner >= 0, which[owner.clamp(min=0)], -1)          # [rows, W]
    sees_prompt = q_prompt[:, :, None] == key_prompt[None, None, :]            # [rows, W, P_tot]
    sees_row = (owner[:, :, None] == owner[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
    out = {}
    for kind, window in windows.items():
        prompt_ok, row_ok = sees_prompt, sees_row
        if window is not None:
            prompt_ok = prompt_ok & (pos[:, :, None] - key_ppos[None, None, :] < window)
            row_ok = row_ok & (pos[:, :, None] - pos[:, None, :] < window)
        allowed = torch.cat([prompt_ok, row_ok], dim=2)[:, None]
        out[kind] = allowed if boolean else torch.zeros(allowed.shape).masked_fill_(
            ~allowed, torch.finfo(torch.float32).min)
    return out
