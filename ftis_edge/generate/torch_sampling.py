"""Sampling in torch on the logits' own device, with exact behaviour log-probs.

The same distribution as ``sampling.py`` (temperature, then top-k, then top-p, renormalised over the
kept tokens; temperature 0 = greedy with log-prob 0), computed where the logits already are: on a
GPU only the sampled ids and their log-probs (n numbers) reach the host, never the [n, vocab] logits
(Gemma's vocabulary is 262k). Computed in float32 whatever the logits' dtype (bf16 on a GPU).
The random stream is torch's (a ``torch.Generator`` seeded from the sampler's seed), so the tokens
differ from the numpy sampler's for the same seed; the distribution and the log-prob contract do not.
"""
from __future__ import annotations

import torch

from .base import SamplerSettings


def processed_logprobs_torch(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                             top_p: float = 1.0) -> torch.Tensor:
    """Log-probs [n, vocab] (float32) of the distribution sampled from; truncated tokens get -inf."""
    z = logits.float()
    if z.dim() == 1:
        z = z[None, :]
    if temperature == 0:
        out = torch.full_like(z, float("-inf"))
        return out.scatter_(1, z.argmax(dim=1, keepdim=True), 0.0)
    z = z / temperature
    vocab = z.shape[1]
    if 0 < top_k < vocab:
        values, index = torch.topk(z, top_k, dim=1)
        z = torch.full_like(z, float("-inf")).scatter_(1, index, values)
    lp = torch.log_softmax(z, dim=1)
    if top_p < 1.0:
        # the smallest most-likely prefix whose mass reaches top_p (at least one token)
        sorted_lp, order = torch.sort(lp, dim=1, descending=True, stable=True)
        p = sorted_lp.exp()
        mass_before = torch.cumsum(p, dim=1) - p
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        lp = torch.log_softmax(z.masked_fill(drop, float("-inf")), dim=1)
    return lp


def sample_tokens_torch(logits: torch.Tensor, settings: SamplerSettings,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` [n, vocab]: (ids [n] long, their exact log-probs [n] float32),
    both on the logits' device."""
    if settings.temperature == 0:
        tokens = logits.argmax(dim=1)
        return tokens, torch.zeros(len(tokens), device=logits.device)
    lp = processed_logprobs_torch(logits, settings.temperature, settings.top_k, settings.top_p)
    tokens = torch.multinomial(lp.exp(), 1, generator=generator)[:, 0]
    return tokens, lp.gather(1, tokens[:, None])[:, 0]


def device_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A torch generator on ``device``, seeded (or from OS entropy when ``seed`` is None)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen
