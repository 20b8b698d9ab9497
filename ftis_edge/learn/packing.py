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

from .shared_prompt import BUCKET_OVERHEAD_TOKENS, PromptState, cache_kwarg, length_buckets

PACKABLE_ATTENTION = ("sdpa", "eager")     # take a custom 4-D mask as given (flash kernels do not)
PACKED_FORWARD_OVERHEAD = BUCKET_OVERHEAD_TOKENS    # a forward's fixed cost in tokens (shared_prompt.py)


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


def packed_hidden(decoder, rows: Sequence[tuple[PromptState, Sequence[int]]], device: torch.device,
                  overhead: int = PACKED_FORWARD_OVERHEAD) -> torch.Tensor:
    """Hidden states that predict every completion token, flat: [sum of completion lengths, hidden],
    row b's token j at ``sum(len(c) for earlier rows) + j``. Token 0 comes from the prompt's last
    position; the others from the packed forward(s).

    The packed rows are filled unevenly (the last ones hold what was left): they run in as many
    forwards as ``length_buckets`` finds cheapest at ``overhead`` tokens per forward, each as wide
    as its fullest row (usually one forward, or two: the full rows and a short remainder)."""
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
    _, place = pack_rows([len(x) for x in inputs])
    lasts = torch.stack([p.last for p in prompts])             # [prompts, hidden]
    fill: dict[int, int] = {}
    for (r, o), x in zip(place, inputs):
        if x:
            fill[r] = max(fill.get(r, 0), o + len(x))
    by_fill = sorted(fill, key=lambda r: fill[r])
    forwards = [[by_fill[i] for i in bucket] for bucket in length_buckets([fill[r] for r in by_fill], overhead)]
    slot: dict[int, int] = {}                                  # packed row -> its first slot in the flat output
    base = len(prompts)
    for group in forwards:
        width = max(fill[r] for r in group)
        for i, r in enumerate(group):
            slot[r] = base + i * width
        base += len(group) * width
    index = []                                                 # where each completion token's predictor lies
    for b, x in enumerate(inputs):
        index.append(which[b])
        if x:
            first = slot[place[b][0]] + place[b][1]
            index += range(first, first + len(x))
    windows = _layer_windows(decoder.config)
    boolean = getattr(decoder.config, "_attn_implementation", "sdpa") == "sdpa"
    kv = [(torch.cat([p.kv[layer][0] for p in prompts], dim=2), torch.cat([p.kv[layer][1] for p in prompts], dim=2))
          for layer in range(len(prompts[0].kv))]               # [1, kv_heads, P_tot, head_dim] each
    outs = [_packed_forward(decoder, kv, [r for r in group], place, inputs, which, prompts, starts, windows,
                            boolean, device) for group in forwards]
    flat = torch.cat([lasts.to(outs[0].dtype if outs else lasts.dtype)] + outs)
    return flat.index_select(0, torch.tensor(index, device=flat.device))


def _packed_forward(decoder, kv, group: list[int], place, inputs, which, prompts, starts, windows, boolean,
                    device) -> torch.Tensor:
    """One forward of the packed rows ``group`` on the prompts' keys/values ``kv``: [rows x W, hidden]."""
    from transformers import DynamicCache

    row_of = {r: i for i, r in enumerate(group)}
    width = max(place[b][1] + len(x) for b, x in enumerate(inputs) if x and place[b][0] in row_of)
    n = len(group)
    ids = torch.zeros(n, width, dtype=torch.long)
    owner = torch.full((n, width), -1, dtype=torch.long)       # sample index; -1 a pad
    pos = torch.arange(width).repeat(n, 1)                     # a pad's position: its own column
    for b, x in enumerate(inputs):
        if not x or place[b][0] not in row_of:
            continue
        i, o = row_of[place[b][0]], place[b][1]
        ids[i, o:o + len(x)] = torch.tensor(x, dtype=torch.long)
        owner[i, o:o + len(x)] = b
        pos[i, o:o + len(x)] = torch.arange(prompts[which[b]].length, prompts[which[b]].length + len(x))
    masks = {k: m.to(device) for k, m in _masks(owner, pos, torch.tensor(which), starts, windows, boolean).items()}
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys.expand(n, -1, -1, -1), values.expand(n, -1, -1, -1), layer)
    out = decoder(input_ids=ids.to(device), attention_mask=masks[""] if "" in masks else masks,
                  position_ids=pos.to(device), use_cache=True, **{cache_kwarg(decoder): cache}).last_hidden_state
    return out.reshape(n * width, -1)


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
