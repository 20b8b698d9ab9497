"""Several prompts in one KV cache of an HF causal LM: the HF backend's batch steps (loop.py,
``generate_many``: an eval's prompts decoded together instead of one at a time).

Every row of the cache holds ``[shared prefix | own tail, left-padded | generated tokens]``. The
prefix all prompts share (an eval's system text and few-shot examples, most of each prompt) is
decoded once and its cache copied to every row; the prompts' own tails are decoded together in one
padded forward. Pads are masked out and each row is fed its true positions, so a row attends to
exactly its own prompt and answer, as it would alone: the logits differ from one prompt at a time
only by the float rounding of other matrix shapes (how often that flips a greedy token is measured
in docs/node.md, "Cost"). A finished sequence's row leaves the cache at the next step.
"""
from __future__ import annotations


class PaddedBatch:
    """The cache, attention mask and live rows of one batch of prompts (k sequences each)."""

    def __init__(self, model, device, cache_kw: str):
        import torch
        self.torch, self.model, self.device, self.cache_kw = torch, model, device, cache_kw
        self.cache = None
        self.mask = None            # (rows, cached tokens): 0 on a pad, 1 elsewhere
        self.slots: list[int] = []

    def start(self, prompts: list[list[int]], k: int, shared: int) -> list:
        """Decode the ``shared`` prefix once and every prompt's tail; k rows per prompt (slot
        p * k + j). Returns the logits row after each prompt's last token (on the device).

        ``shared`` >= 1 and every prompt longer than it: a pad then always has the prefix to
        attend to (a row of pads with nothing to attend to would make NaNs)."""
        torch = self.torch
        if shared < 1 or any(len(p) <= shared for p in prompts):
            raise ValueError(f"PaddedBatch needs a shared prefix of >= 1 token and a tail per prompt (shared {shared})")
        res = self.model(input_ids=torch.tensor([prompts[0][:shared]], device=self.device), use_cache=True,
                         logits_to_keep=1)
        cache = cache_of(res)
        if len(prompts) > 1:
            cache.batch_repeat_interleave(len(prompts))
        tails = [p[shared:] for p in prompts]
        width = max(len(t) for t in tails)
        ids, mask, pos = [], [], []
        for t in tails:
            pad = width - len(t)
            ids.append([t[0]] * pad + t)                       # a pad's id is never seen (masked)
            mask.append([1] * shared + [0] * pad + [1] * len(t))
            pos.append([shared] * pad + list(range(shared, shared + len(t))))
        mask_t = torch.tensor(mask, device=self.device)
        res = self.model(input_ids=torch.tensor(ids, device=self.device), attention_mask=mask_t,
                         position_ids=torch.tensor(pos, device=self.device), use_cache=True, logits_to_keep=1,
                         **{self.cache_kw: cache})
        self.cache = cache_of(res)
        if k > 1:
            self.cache.batch_repeat_interleave(k)
            mask_t = mask_t.repeat_interleave(k, dim=0)
        self.mask = mask_t
        self.slots = list(range(len(prompts) * k))
        return list(res.logits[:, -1])

    def step(self, slots: list[int], tokens: list[int], positions: list[int]):
        """loop.py's decode step: ``tokens[j]`` at ``positions[j]`` for live slot ``slots[j]``;
        the rows of slots gone since the last step leave the cache first. Logits (len(slots), vocab)."""
        torch = self.torch
        if len(slots) < len(self.slots):
            row = {s: r for r, s in enumerate(self.slots)}
            keep = torch.tensor([row[s] for s in slots], device=self.device)
            self.cache.batch_select_indices(keep)
            self.mask = self.mask[keep]
        self.slots = list(slots)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(slots), 1))], dim=1)
        res = self.model(input_ids=torch.tensor([[t] for t in tokens], device=self.device),
                         attention_mask=self.mask, position_ids=torch.tensor([[p] for p in positions], device=self.device),
                         use_cache=True, logits_to_keep=1, **{self.cache_kw: self.cache})
        self.cache = cache_of(res)
        return res.logits[:, -1]


def cache_of(output):
    """The KV cache a forward returned (transformers >= 5.2x calls it ``cache``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
