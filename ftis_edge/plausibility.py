"""Is a peer's text something this learner would write? The learner-side poisoning filter.

A peer can make any text win: put a phrase (a URL, an instruction) inside a correct answer
and the re-graded reward is high, the advantage positive, and F-TIS never filters a
positive-advantage sample. Nothing the peer sends can tell us whether the text is honest
(log-probs are forgeable), so the judge is the learner itself, on the tokens it is about
to train on (docs/relay.md, "Threat model: what peer text can teach").

The score of a token is its *excess log-probability* ``x_t = log π(a_t) + H_t``: its
log-prob under the learner plus the entropy of the learner's next-token distribution there.
Its expectation is 0 for text the learner samples itself at T = 1 (and > 0 at T < 1), so a
token is only suspicious where the learner was confident and the text went elsewhere; a
low-probability token in a high-entropy place is not. A sample's score is the mean of x
over its worst window of ``WINDOW`` consecutive tokens. The threshold is calibrated on
this step's own completions: a low quantile of their scores minus a margin. A peer sample
scoring below it is not trained on (weight 0), whatever its advantage. Own samples are
never judged, so a node alone trains exactly as before.

Pure functions over tensors; the learner computes the inputs in its step (no extra pass).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

WINDOW = 12            # tokens per window: a phrase shorter than this is diluted, one longer is caught
OWN_QUANTILE = 0.05    # the calibration quantile of own samples' scores ...
MARGIN = 0.5           # ... minus this (nats per token)
MIN_OWN_SAMPLES = 8    # fewer own samples in a step: keep the last threshold (or DEFAULT_THRESHOLD)
DEFAULT_THRESHOLD = -2.5   # before any calibration (x has a model-independent scale: 0 on own text)


@dataclass(frozen=True)
class PlausibilityConfig:
    window: int = WINDOW
    quantile: float = OWN_QUANTILE
    margin: float = MARGIN
    min_own: int = MIN_OWN_SAMPLES
    default_threshold: float = DEFAULT_THRESHOLD


def excess_logp(logp: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x = ℓ + H per token [B,T] (0 at padding), detached, float32."""
    x = logp.detach().float() + entropy.detach().float()
    return torch.where(mask, x, 0.0)


def worst_window(x: torch.Tensor, mask: torch.Tensor, window: int) -> torch.Tensor:
    """[B] the lowest mean of x over ``window`` consecutive tokens of each row (rows are
    left-aligned); a row shorter than the window scores its mean; an empty row +inf."""
    x = torch.where(mask, x.float(), 0.0)
    n = mask.sum(-1)
    B, T = x.shape
    c = torch.cat([torch.zeros(B, 1, dtype=torch.float64, device=x.device), x.double().cumsum(-1)], -1)
    w = min(window, T)
    if w == 0:
        return torch.full((B,), math.inf)
    means = (c[:, w:] - c[:, :-w]) / w                              # [B, T - w + 1], window ending at j + w
    ends = torch.arange(w, T + 1, device=x.device)[None, :]
    means = torch.where(ends <= n[:, None], means, math.inf)       # only windows inside the row
    short = n < w
    whole = c.gather(1, n[:, None]).squeeze(1) / n.clamp(min=1)
    out = torch.where(short, whole, means.min(-1).values)
    return torch.where(n == 0, math.inf, out).float()


def calibrate(own_scores: torch.Tensor, cfg: PlausibilityConfig, previous: float | None) -> float:
    """The threshold from this step's own samples' scores, or the previous one when there are
    too few own samples (then the default before any calibration)."""
    s = own_scores[torch.isfinite(own_scores)]
    if s.numel() < cfg.min_own:
        return cfg.default_threshold if previous is None else previous
    return float(torch.quantile(s.double(), cfg.quantile)) - cfg.margin


def plausible_weight(scores: torch.Tensor, is_peer: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B] sample weights: 0 for a peer sample scoring below the threshold, else 1."""
    return torch.where(is_peer & (scores < threshold), 0.0, 1.0)
