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
the node's own completions (the last ``OWN_POOL``): a low quantile of their scores minus a
margin, never stricter than ``CEILING``. A peer sample
scoring below it is not trained on (weight 0), whatever its advantage. Own samples are
never judged, so a node alone trains exactly as before.

A surprise detector cannot tell a short injected phrase from the tail tokens that honest
sampling at T = 1 produces (1 % of a SmolLM2 node's own tokens score x < −8, like a URL's),
so a second rule bounds what *repetition* can teach, which is what an injection needs: a
single exposure moves a phrase's log-prob by a fraction of a nat, twenty move it by ten.
``RepeatMemory`` remembers every *unlikely* n-gram (``NGRAM`` tokens whose learner log-probs
sum below a threshold) that a positive-advantage peer sample has been trained on; when one
comes again, in any peer's sample, its tokens get weight 0. Honest sampling rarely repeats
an unlikely n-gram (its surprises are random); a phrase repeated to be learned is trained
once. Likely n-grams (the task's own formulas, copied numbers) are never remembered.

Pure functions over tensors; the learner computes the inputs in its step (no extra pass).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch

WINDOW = 12            # tokens per window: a phrase shorter than this is diluted, one longer is caught
OWN_QUANTILE = 0.05    # the calibration quantile of own samples' scores ...
MARGIN = 0.5           # ... minus this (nats per token)
MIN_OWN_SAMPLES = 8    # fewer own samples remembered: keep the last threshold (or DEFAULT_THRESHOLD)
DEFAULT_THRESHOLD = -2.5   # before any calibration (x has a model-independent scale: 0 on own text)
CEILING = DEFAULT_THRESHOLD   # never stricter than this: a node whose own text is unusually tidy
                              # (one prompt a round, T < 1) must not refuse honest T = 1 peers
OWN_POOL = 256         # own samples' scores the calibration remembers, over steps: one group a round
                       # (batch fill) is 8 samples of one prompt, too few for a 5 % quantile
NGRAM = 4              # tokens per n-gram the repeat memory keys on
NGRAM_LOGP = -12.0     # an n-gram is unlikely below this summed learner log-prob (nats; see docs/ftis.md)
MEMORY = 200_000       # unlikely n-grams remembered (oldest forgotten first): ~30 MB at most
# Samples of a peer that claims another tokenizer, judged on the learner's re-tokenization of
# their text. Their calibration is fixed, never fed by peers (an attacker's own samples must not
# loosen the threshold for its kind): honest Gemma 3 270M text scored by a SmolLM2 learner has
# worst-window quantiles 1 / 5 / 50 % of -4.37 / -4.30 / -2.69 (docs/relay.md), so -5.0 keeps
# >= 99 % of it while a URL-like phrase (x < -8 a token) still fails.
FOREIGN_THRESHOLD = -5.0
FOREIGN_NGRAM = 3      # shorter n-grams: a 3-token payload in fresh words each time repeats as a 3-gram
FOREIGN_NGRAM_LOGP = -9.0   # the same -3 nats a token as NGRAM_LOGP
FOREIGN_PHRASE = 8     # and any 8-gram, likely or not, is taught once: a phrase of likely words
                       # repeated to be learned ("Let me know if ...") needs no surprise to work
# What another tokenizer's text may weigh in a step. Its worth to a node is about nothing (H6's
# records: -1 to -3 ID points at equal own tokens, docs/results.md), while any text made of
# tokens we already find likely, in fresh words every time, passes every surprise and repeat
# rule (issue 51 item 3: +1.2 to +2.7 nats over the control). So it trains at a bounded weight:
# each such sample at most FOREIGN_SAMPLE_WEIGHT of an own sample, all of a step's together at
# most FOREIGN_STEP_WEIGHT (more ids, or more samples, share it); the bound, not a phrase
# list, is what an attacker of the class meets. Half of the first bound (1/8, 1/4): at that one a
# one-sample-a-step drip of a likely payload rose 1.33 nats over its control in 40 steps
# (docs/relay.md), at this one every variant stays within 1 nat with no threshold and no memory.
FOREIGN_SAMPLE_WEIGHT = 0.0625
FOREIGN_STEP_WEIGHT = 0.125


@dataclass(frozen=True)
class PlausibilityConfig:
    window: int = WINDOW
    quantile: float = OWN_QUANTILE
    margin: float = MARGIN
    min_own: int = MIN_OWN_SAMPLES
    default_threshold: float = DEFAULT_THRESHOLD
    ceiling: float = CEILING
    pool: int = OWN_POOL
    ngram: int = NGRAM
    ngram_logp: float = NGRAM_LOGP
    # Claimed-foreign samples meet the bound and nothing else by default: the fixed threshold and
    # the repeat memories below masked a third of honest Gemma 3 text's tokens (its answers share
    # one template), and the bound alone holds every measured poisoning variant within 1 nat of
    # its control (issue 51 item 3, docs/relay.md).
    judge_foreign: bool = False         # True: the fixed threshold and 3-gram / 8-gram memories too
    foreign_threshold: float = FOREIGN_THRESHOLD
    foreign_ngram: int = FOREIGN_NGRAM
    foreign_ngram_logp: float = FOREIGN_NGRAM_LOGP
    foreign_phrase: int = FOREIGN_PHRASE
    bound_foreign: bool = True          # False: claimed-foreign samples train at their full weight
    foreign_sample_weight: float = FOREIGN_SAMPLE_WEIGHT
    foreign_step_weight: float = FOREIGN_STEP_WEIGHT
    foreign_memories: bool = False      # True: the repeat memories on claimed-foreign samples too
    #                                     (3-gram and 8-gram with judge_foreign; 4-gram without)

    def __post_init__(self):
        if not (0.0 <= self.foreign_sample_weight <= 1.0 and self.foreign_step_weight >= 0.0):
            raise ValueError("PlausibilityConfig: 0 <= foreign_sample_weight <= 1, foreign_step_weight >= 0")


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
    """The threshold from the remembered own samples' scores (never above ``cfg.ceiling``), or
    the previous one when there are too few (then the default before any calibration)."""
    s = own_scores[torch.isfinite(own_scores)]
    if s.numel() < cfg.min_own:
        return cfg.default_threshold if previous is None else previous
    return min(float(torch.quantile(s.double(), cfg.quantile)) - cfg.margin, cfg.ceiling)


def foreign_factors(claimed: list[bool], cfg: PlausibilityConfig) -> list[float]:
    """Per sample of one step: the factor its weight is multiplied by. 1 for own and
    same-tokenizer samples; for a peer's sample claiming another tokenizer (``claimed``) at most
    ``foreign_sample_weight``, and all of them together at most ``foreign_step_weight``."""
    n = sum(claimed)
    if not cfg.bound_foreign or n == 0:
        return [1.0] * len(claimed)
    each = min(cfg.foreign_sample_weight, cfg.foreign_step_weight / n)
    return [each if c else 1.0 for c in claimed]


def plausible_weight(scores: torch.Tensor, is_peer: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B] sample weights: 0 for a peer sample scoring below the threshold, else 1."""
    return torch.where(is_peer & (scores < threshold), 0.0, 1.0)


class RepeatMemory:
    """The unlikely n-grams positive-advantage peer samples have been trained on (FIFO, bounded)."""

    def __init__(self, capacity: int = MEMORY):
        self.capacity = capacity
        self._seen: OrderedDict[tuple[int, ...], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def judge(self, ids: list[int], logp: list[float], n: int = NGRAM, threshold: float = NGRAM_LOGP,
              prompt_ids: list[int] = ()) -> list[bool]:
        """Per token of one sample: True where it lies in a remembered n-gram (not to be trained),
        however likely training has made it since (the slow attack). Every unlikely n-gram of
        the sample is remembered, in order, so a phrase repeated inside one sample, or in the
        next sample of the same step, is caught too: an attacker gets one exposure, whichever
        prompts it uses (keyed by prompt, the memory let it repeat a phrase under one question:
        +3.65 nats in 15 steps; by prompt and step, +1.31: docs/relay.md). The price: honest
        answers to one question that share an unusual phrase mask it after the first (0.5 % of
        their tokens).
        N-grams of the prompt are neither remembered nor masked: an answer copies its question."""
        masked = [False] * len(ids)
        quoted = {tuple(prompt_ids[j:j + n]) for j in range(len(prompt_ids) - n + 1)}
        for j in range(len(ids) - n + 1):
            key = tuple(ids[j:j + n])
            if key in quoted:
                continue
            if key in self._seen:
                self._seen.move_to_end(key)
                masked[j:j + n] = [True] * n
            elif sum(logp[j:j + n]) < threshold:
                self._seen[key] = None
                if len(self._seen) > self.capacity:
                    self._seen.popitem(last=False)
        return close_gaps(masked, n)


def close_gaps(masked: list[bool], gap: int) -> list[bool]:
    """Also mask runs of at most ``gap`` unmasked tokens between two masked ones: the likely
    n-grams inside a repeated phrase ("://", ".com") would otherwise train every time."""
    out = list(masked)
    last = None
    for t, m in enumerate(masked):
        if m:
            if last is not None and 0 < t - last - 1 <= gap:
                out[last + 1:t] = [True] * (t - last - 1)
            last = t
    return out
