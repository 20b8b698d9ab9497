"""F-TIS and friends: the GRPO objective for on- and off-policy samples.

Pure functions over tensors (torch only, no I/O, no globals); CPU or CUDA; float32 or
bfloat16 inputs, always computed in float32. The math is in docs/ftis.md:

    L = (1/N) Σ_i (1/|a_i|) Σ_t term_{i,t}

with one of five per-token terms (nois, vis, tis, f-tis, f-vis), at one of three levels
(token; span and sequence for peers with another tokenizer). Masked (padding) positions
may hold garbage, NaN or -inf: they are replaced with ``torch.where`` before any arithmetic,
so they never change the loss or its gradient.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import NamedTuple

import torch

from ..errors import FtisError

METHODS = ("nois", "vis", "tis", "f-tis", "f-vis")
LEVELS = ("token", "sequence", "span")   # an int level tensor holds indices into this
NORMALIZE = ("all", "kept")
ADVANTAGE_SCALES = ("std", "none")

LOGP_TOLERANCE = 1e-4      # a log-prob above this is a bug upstream, not rounding
STD_EPS = 1e-4             # Â = (r - mean) / (std + STD_EPS), as in docs/ftis.md
VIS_LOG_RATIO_CLAMP = 20.0  # |ℓ - g| is clamped for vis's ρ (as verl does) so ρ stays finite
K3_EXP_CLAMP = 50.0        # exp(g - ℓ) in k3 is capped at e^50: still "huge", never inf


class ObjectiveError(FtisError, ValueError):
    """Invalid input to the objective (shapes, values or options), with a readable reason."""


# --------------------------------------------------------------------------- advantages

def group_advantages(rewards, scale: str = "std") -> torch.Tensor:
    """Group-relative advantages of one group of rewards.

    scale="std":  (r - mean) / (std + 1e-4), std = *sample* std (Bessel, torch's default,
                  as TRL and verl compute it).
    scale="none": r - mean (Dr. GRPO; what the authors' code effectively runs).

    A group whose rewards are all equal (including a group of one) returns exact zeros: it
    carries no signal and never produces a NaN. Returns float32 on the rewards' device.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ObjectiveError(f"unknown advantage scale {scale!r}; expected one of {ADVANTAGE_SCALES}")
    try:
        r = torch.as_tensor(rewards)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ObjectiveError(f"rewards must be a 1-D sequence of numbers: {exc}") from None
    if r.dim() != 1 or r.numel() == 0:
        raise ObjectiveError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(r.shape)}")
    r = r.to(torch.float64)  # float64: equal rewards give exactly equal values, mean exact
    if not torch.isfinite(r).all():
        raise ObjectiveError(f"rewards must be finite, got {r.tolist()}")
    if bool((r == r[0]).all()):
        return torch.zeros(r.shape, dtype=torch.float32, device=r.device)
    centered = r - r.mean()
    if scale == "std":
        centered = centered / (r.std(unbiased=True) + STD_EPS)  # n >= 2 here: never NaN
    return centered.to(torch.float32)


# --------------------------------------------------------------------------- filter

def filter_dropped(advantages: torch.Tensor, kl: torch.Tensor, kl_threshold: float) -> torch.Tensor:
    """The F- rule: drop sample i iff Â_i <= 0 AND KL_i > g. Bool [B].

    Positive-advantage samples are never dropped, whatever their KL.
    """
    return (advantages <= 0) & (kl > kl_threshold)


def _k3(delta: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 = exp(δ) − δ − 1 with δ = g − ℓ (>= 0; the exponent is capped, see top).
    Clamped at 0: for |δ| ~ 1e-7 float32 rounding can give -6e-8, which k3 never is."""
    return (torch.exp(delta.clamp(max=K3_EXP_CLAMP)) - delta - 1.0).clamp(min=0.0)


# --------------------------------------------------------------------------- validation

def _first_bad(bad: torch.Tensor, values: torch.Tensor) -> str:
    """'[row r, col c] = v' for the first True of a [B,T] (or [B]) bad mask."""
    idx = bad.nonzero()[0].tolist()
    where = ", ".join(f"{n} {i}" for n, i in zip(("row", "col"), idx))
    return f"[{where}] = {values[tuple(idx)].item()!r}"


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ObjectiveError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _check_logp(values: torch.Tensor, where: torch.Tensor, name: str, tol) -> None:
    """Log-probs inside the mask must be finite and <= 0 (up to a tolerance)."""
    finite = torch.isfinite(values)
    bad = where & ~finite
    if bool(bad.any()):
        raise ObjectiveError(f"{name} has a non-finite value inside the mask at {_first_bad(bad, values)}")
    # torch.where, not values * mask: masked garbage must not reach the comparison either
    bad = where & (torch.where(finite, values.float(), 0.0) > tol)
    if bool(bad.any()):
        raise ObjectiveError(
            f"{name} must be log-probabilities (<= 0) inside the mask; got {_first_bad(bad, values)}")


def _level_codes(level, B: int, dev) -> torch.Tensor:
    """level -> int64 [B] of indices into LEVELS (0 token, 1 sequence, 2 span)."""
    if isinstance(level, str):
        if level not in LEVELS:
            raise ObjectiveError(f"unknown level {level!r}; expected one of {LEVELS} or a tensor [B]")
        return torch.full((B,), LEVELS.index(level), dtype=torch.long, device=dev)
    if isinstance(level, torch.Tensor):
        if tuple(level.shape) != (B,) or level.is_floating_point() or level.is_complex():
            raise ObjectiveError(f"level tensor must be bool (True = sequence) or int (indices into {LEVELS}) "
                                 f"of shape {(B,)}, got {level.dtype} {tuple(level.shape)}")
        if level.dtype == torch.bool:
            return level.to(dev).long()
        if bool(((level < 0) | (level >= len(LEVELS))).any()):
            raise ObjectiveError(f"level codes must index {LEVELS}, got {level.tolist()}")
        return level.to(dev).long()
    raise ObjectiveError(f"level must be one of {LEVELS} or a tensor [B], got {type(level).__name__}")


def _prepare_spans(span_ids, gen_span_logp, span_tok: torch.Tensor, l: torch.Tensor):
    """Span-level inputs: (sid [B,T] long, G [B,S] float32, n_k [B,S] learner tokens per span).

    Only the positions of span rows inside the mask are read; a span no such token refers to
    is ignored (its G is 0 and n_k is 0)."""
    B, T = span_tok.shape
    dev = l.device
    if not bool(span_tok.any()):
        z = torch.zeros(B, 1, device=dev)
        return torch.zeros(B, T, dtype=torch.long, device=dev), z, z
    if span_ids is None or gen_span_logp is None:
        raise ObjectiveError("span-level samples need span_ids [B, T] and gen_span_logp [B, S]")
    span_ids = _tensor(span_ids, "span_ids").to(dev)
    gen_span_logp = _tensor(gen_span_logp, "gen_span_logp").to(dev)
    if tuple(span_ids.shape) != (B, T) or span_ids.is_floating_point() or span_ids.dtype == torch.bool:
        raise ObjectiveError(f"span_ids must be an integer tensor of logp's shape {(B, T)}, got "
                             f"{span_ids.dtype} {tuple(span_ids.shape)}")
    if gen_span_logp.dim() != 2 or gen_span_logp.shape[0] != B or not gen_span_logp.is_floating_point():
        raise ObjectiveError(f"gen_span_logp must be a float tensor [B, S] with B = {B}, got "
                             f"{gen_span_logp.dtype} {tuple(gen_span_logp.shape)}")
    S = gen_span_logp.shape[1]
    if S == 0:
        gen_span_logp = torch.zeros(B, 1, device=dev)   # no span: nothing may refer to one
    bad = span_tok & ((span_ids < 0) | (span_ids >= S))
    if bool(bad.any()):
        raise ObjectiveError(f"span_ids must lie in [0, {S}) inside the mask; got {_first_bad(bad, span_ids)}")
    sid = torch.where(span_tok, span_ids.long(), 0)
    n_k = torch.zeros(B, max(S, 1), device=dev).scatter_add(1, sid, span_tok.float())
    used = n_k > 0
    tol = LOGP_TOLERANCE * n_k.clamp(min=1)       # a span's log-prob is a sum of a few tokens'
    _check_logp(gen_span_logp.detach(), used, "gen_span_logp", tol)
    G = torch.where(used, gen_span_logp.detach().float(), 0.0)
    return sid, G, n_k


class Prepared(NamedTuple):
    """The objective's validated inputs: float32 tensors on logp's device, padding zeroed."""
    l: torch.Tensor          # [B,T] learner log-probs ℓ (with grad)
    g: torch.Tensor          # [B,T] generator log-probs (token rows; sequence rows without a sum)
    gsum: torch.Tensor       # [B]   generator log-prob of each sequence-level row's text
    mask: torch.Tensor       # [B,T] bool
    seq: torch.Tensor        # [B]   bool: sequence-level row
    span: torch.Tensor       # [B]   bool: span-level row
    sid: torch.Tensor        # [B,T] long: span index of each token (span rows)
    G: torch.Tensor          # [B,S] generator log-prob of each span
    n_k: torch.Tensor        # [B,S] learner tokens per span
    n: torch.Tensor          # [B]   tokens per row |a_i|
    B: int
    A: torch.Tensor | None   # [B]   advantages (None when not given)


def _prepare(logp, gen_logp, mask, advantages=None, level="token", gen_logp_sum=None,
             span_ids=None, gen_span_logp=None) -> Prepared:
    """Validate and convert (see ``Prepared``)."""
    logp = _tensor(logp, "logp")
    gen_logp = _tensor(gen_logp, "gen_logp")
    mask = _tensor(mask, "mask")
    if logp.dim() != 2:
        raise ObjectiveError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    B, T = logp.shape
    if B == 0:
        raise ObjectiveError("empty batch: logp has 0 samples")
    for name, x in (("gen_logp", gen_logp), ("mask", mask)):
        if tuple(x.shape) != (B, T):
            raise ObjectiveError(f"{name} must have logp's shape {(B, T)}, got {tuple(x.shape)}")
    if not (logp.is_floating_point() and gen_logp.is_floating_point()):
        raise ObjectiveError(f"logp and gen_logp must be floating point, got {logp.dtype} and {gen_logp.dtype}")
    dev = logp.device
    gen_logp, mask = gen_logp.to(dev), mask.to(dev)

    if mask.dtype != torch.bool:
        if mask.is_floating_point() and not bool(torch.isfinite(mask).all()):
            raise ObjectiveError("mask must hold only 0/1 (or bool), found NaN/inf")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ObjectiveError(f"mask must hold only 0/1 (or bool), found {_first_bad((mask != 0) & (mask != 1), mask)}")
        mask = mask != 0

    code = _level_codes(level, B, dev)
    seq, span = code == 1, code == 2                   # sequence-level / span-level rows

    n = mask.sum(-1)                                   # |a_i| (int)
    _check_logp(logp, mask, "logp", LOGP_TOLERANCE)
    l = torch.where(mask, logp.float(), 0.0)           # keeps the graph; padding → 0, grad 0

    # per-token generator values are needed for token-level rows, and for sequence-level
    # rows only when no gen_logp_sum is given (then gen_sum = Σ_t g); never for span rows
    if gen_logp_sum is None:
        need_g = mask & ~span[:, None]
    else:
        need_g = mask & (code == 0)[:, None]
    _check_logp(gen_logp, need_g, "gen_logp", LOGP_TOLERANCE)
    g = torch.where(need_g, gen_logp.detach().float(), 0.0)

    if gen_logp_sum is None:
        gsum = g.sum(-1)
    else:
        gen_logp_sum = _tensor(gen_logp_sum, "gen_logp_sum").to(dev)
        if tuple(gen_logp_sum.shape) != (B,) or not gen_logp_sum.is_floating_point():
            raise ObjectiveError(f"gen_logp_sum must be a float tensor [B] = {(B,)}, got "
                                 f"{gen_logp_sum.dtype} {tuple(gen_logp_sum.shape)}")
        tol = LOGP_TOLERANCE * n.clamp(min=1).to(torch.float32)  # a sum of log-probs
        _check_logp(gen_logp_sum.detach(), seq, "gen_logp_sum", tol)
        gsum = torch.where(seq, gen_logp_sum.detach().float(), 0.0)

    sid, G, n_k = _prepare_spans(span_ids, gen_span_logp, mask & span[:, None], l)

    A = None
    if advantages is not None:
        advantages = _tensor(advantages, "advantages").to(dev)
        if tuple(advantages.shape) != (B,):
            raise ObjectiveError(f"advantages must be [B] = {(B,)}, got {tuple(advantages.shape)}")
        if not bool(torch.isfinite(advantages).all()):
            raise ObjectiveError(f"advantages must be finite; got {_first_bad(~torch.isfinite(advantages), advantages)}")
        A = advantages.detach().float()
    return Prepared(l=l, g=g, gsum=gsum, mask=mask, seq=seq, span=span, sid=sid, G=G, n_k=n_k, n=n, B=B, A=A)


def _check_options(method, C, eps, kl_threshold, normalize, num_samples):
    if method not in METHODS:
        raise ObjectiveError(f"unknown method {method!r}; expected one of {METHODS}")
    if normalize not in NORMALIZE:
        raise ObjectiveError(f"unknown normalize {normalize!r}; expected one of {NORMALIZE}")
    if not isinstance(C, Real) or not math.isfinite(C) or C <= 0:
        raise ObjectiveError(f"C (truncation) must be a finite number > 0, got {C!r}")
    if not isinstance(eps, Real) or not 0 <= eps < 1:
        raise ObjectiveError(f"eps (clip) must be in [0, 1), got {eps!r}")
    if not isinstance(kl_threshold, Real) or math.isnan(kl_threshold) or kl_threshold < 0:
        raise ObjectiveError(f"kl_threshold must be a number >= 0 (inf disables the KL rule), got {kl_threshold!r}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, Integral)
                                    or num_samples < 0):
        raise ObjectiveError(f"num_samples must be a non-negative int, got {num_samples!r}")


def _sample_weight(w, B: int, T: int, dev) -> torch.Tensor:
    w = _tensor(w, "sample_weight")
    if tuple(w.shape) not in ((B,), (B, T)) or not w.is_floating_point():
        raise ObjectiveError(f"sample_weight must be a float tensor [B] = {(B,)} or [B, T] = {(B, T)}, "
                             f"got {w.dtype} {tuple(w.shape)}")
    bad = ~torch.isfinite(w) | (w < 0) | (w > 1)
    if bool(bad.any()):
        raise ObjectiveError(f"sample_weight must lie in [0, 1]; got {_first_bad(bad, w)}")
    return w.detach().to(dev, torch.float32)


# --------------------------------------------------------------------------- public API

def kl_k3(logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 score, [B] float32, no gradient.

    KL_i = mean over sample i's own tokens of exp(g − ℓ) − (g − ℓ) − 1, evaluated on the
    sampled tokens only. A sample with no tokens scores 0.
    """
    with torch.no_grad():
        b = _prepare(logp, gen_logp, mask)
        k = torch.where(b.mask, _k3(b.g - b.l), 0.0)
        return k.sum(-1) / b.n.clamp(min=1)


def _foreign_rows(foreign, B: int, dev) -> torch.Tensor:
    """bool [B]: rows generated by another model (none when ``foreign`` is None)."""
    if foreign is None:
        return torch.zeros(B, dtype=torch.bool, device=dev)
    foreign = _tensor(foreign, "foreign")
    if tuple(foreign.shape) != (B,) or foreign.dtype != torch.bool:
        raise ObjectiveError(f"foreign must be a bool tensor [B] = {(B,)}, got {foreign.dtype} {tuple(foreign.shape)}")
    return foreign.to(dev)


def ftis_loss(logp, gen_logp, advantages, mask, *, method: str = "f-tis", C: float = 2.0,
              eps: float = 0.2, kl_threshold: float = 5.0, level="token", normalize: str = "all",
              num_samples: int | None = None, gen_logp_sum: torch.Tensor | None = None,
              span_ids: torch.Tensor | None = None, gen_span_logp: torch.Tensor | None = None,
              sample_weight: torch.Tensor | None = None, foreign: torch.Tensor | None = None,
              foreign_cap: float | None = None):
    """The GRPO loss with off-policy correction; returns (loss, stats).

    logp        [B,T] learner log-probs ℓ of the sampled tokens (with grad), float32/bf16.
    gen_logp    [B,T] generator log-probs g of the same tokens (no grad used).
    advantages  [B]   Â_i, computed over the whole group beforehand (group_advantages).
    mask        [B,T] bool or 0/1; padding values are ignored whatever they hold.
    method      nois | vis | tis | f-tis | f-vis (docs/ftis.md; f- = with the KL filter).
    C, eps      truncation of the IS weight; PPO clip range.
    kl_threshold  g of the filter: drop iff Â_i <= 0 and KL_i > g (f- methods only).
    level       "token", "sequence" (cross-tokenizer: one weight per sequence), "span"
                (cross-tokenizer: one weight per span between shared byte boundaries), or a
                tensor [B] for a mixed batch: bool (True = sequence level) or int (indices
                into LEVELS: 0 token, 1 sequence, 2 span).
    normalize   "all": divide by N = B; "kept": by the samples the filter kept (non-empty).
    num_samples overrides that divisor, so micro-batch losses sum to the full-batch loss
                (pass the full batch's B, or its total kept count with normalize="kept").
    gen_logp_sum [B] generator log-prob of each sequence-level sample's text (its own
                tokenization); if None, Σ_t gen_logp over the mask.
    span_ids    [B,T] int: span index of each learner token (span rows only; see align.py).
    gen_span_logp [B,S] generator log-prob of each span (sum of the peer's own tokens in it).
    sample_weight [B] or [B,T] in [0, 1], or None (all 1): multiplies sample i's term (or each
                token's term) whatever its advantage (the learner's plausibility filter sets 0
                on peer text it finds implausible, plausibility.py); the divisors (N, and each
                sample's token count) are unchanged, so a weight only ever removes signal.
    foreign     [B] bool, or None: rows generated by another model (another tokenizer, or the
                same tokenizer with other base weights).
    foreign_cap upper bound on those rows' IS weight instead of C (None: C for every row).
                At 1 (the node's default) a text the learner already finds likelier than its
                generator did is never up-weighted, so imitating it cannot raise its own weight
                (docs/ftis.md, "Samples from another model"); vis / f-vis clip those rows' ratio
                at min(1 + eps, foreign_cap) instead of 1 + eps.

    A sample with no tokens contributes 0 (reported as stats["samples/empty"]).
    stats: python floats named as in docs/ftis.md, plus stats["per_sample"] (detached [B]
    tensors: kl, is_weight, dropped, advantage, tokens, sequence_level, span_level, foreign, capped).
    """
    _check_options(method, C, eps, kl_threshold, normalize, num_samples)
    if foreign_cap is not None and (not isinstance(foreign_cap, Real) or not math.isfinite(foreign_cap)
                                    or foreign_cap <= 0):
        raise ObjectiveError(f"foreign_cap must be a finite number > 0 or None, got {foreign_cap!r}")
    b = _prepare(logp, gen_logp, mask, advantages, level, gen_logp_sum, span_ids, gen_span_logp)
    B = b.B
    foreign_row = _foreign_rows(foreign, B, b.l.device)
    capped_row = foreign_row if foreign_cap is not None else torch.zeros_like(foreign_row)
    sw = None if sample_weight is None else _sample_weight(sample_weight, B, b.l.shape[1], b.l.device)
    l = b.l
    if sw is not None and sw.dim() == 2:   # a token of weight 0 gets no gradient at any level
        l = torch.where(sw > 0, l, l.detach())   # (a sequence-level ratio sums every token's ℓ)
    # the cap of each row's IS weight: C, or foreign_cap for another model's rows
    cap = torch.full((B, 1), float(C), device=l.device)
    if foreign_cap is not None:
        cap = torch.where(capped_row[:, None], min(float(foreign_cap), float(C)), cap)

    w = _off_policy(b, l, cap, capped_row, C, kl_threshold, method)
    term, clip_active = _token_term(method, b, l, w, cap, eps, foreign_cap)
    term = torch.where(b.mask, term, 0.0)
    if sw is not None and sw.dim() == 2:
        term = term * sw
    per_sample = term.sum(-1) / b.n.clamp(min=1).to(torch.float32)   # (1/|a_i|) Σ_t term_{i,t}
    if sw is not None and sw.dim() == 1:
        per_sample = per_sample * sw

    N = _divisor(normalize, num_samples, B, int(w.kept.sum()))
    # N == 0 only when nothing is kept: every per-sample term is then 0, so the loss is 0
    loss = per_sample.sum() / max(N, 1)

    stats = _stats(loss, b, w.empty, w.kl, w.adv_le0, w.kl_gt, w.dropped, w.adv, w.weight, w.truncated, w.ls,
                   clip_active, w.span_lr, foreign_row, w.capped)
    return loss, stats


class OffPolicy(NamedTuple):
    """The no-grad quantities of one batch: IS weights, KL scores and the filter's decision."""
    ls: torch.Tensor           # [B,T] ℓ, detached
    span_lr: torch.Tensor      # [B,S] log(π_θ/π_gen) of each span
    tok_span_lr: torch.Tensor  # [B,T] that, read back onto each span's tokens
    weight: torch.Tensor       # [B,T] min(exp(sg(ℓ) − g), cap)
    truncated: torch.Tensor    # [B,T] bool: the raw weight reached C
    capped: torch.Tensor       # [B]   bool: the foreign cap lowered a weight
    kl: torch.Tensor           # [B]   k3 score
    empty: torch.Tensor        # [B]   bool: no tokens
    adv_le0: torch.Tensor      # [B]   bool: Â <= 0
    kl_gt: torch.Tensor        # [B]   bool: KL > g
    dropped: torch.Tensor      # [B]   bool: the filter dropped the sample
    adv: torch.Tensor          # [B]   Â, 0 where dropped
    kept: torch.Tensor         # [B]   bool: not dropped and not empty


def _off_policy(b: Prepared, l, cap, capped_row, C, kl_threshold, method) -> OffPolicy:
    """IS weight, KL score and filter decision per token / sample (no gradient)."""
    m, n, A = b.mask, b.n, b.A
    n_f = n.clamp(min=1).to(torch.float32)
    empty = n == 0
    seq_t, span_t = b.seq[:, None], b.span[:, None]
    with torch.no_grad():
        ls = l.detach()
        lsum = ls.sum(-1)
        # span level: log(π_θ/π_gen) of each span's bytes, L_k − G_k, read back onto its tokens
        L_k = torch.zeros_like(b.G).scatter_add(1, b.sid, torch.where(m & span_t, ls, 0.0))
        span_lr = L_k - b.G                                    # [B, S]; 0 where no token refers
        tok_span_lr = span_lr.gather(1, b.sid)                 # [B, T]
        # log(π_θ/π_gen): per token, per span, or the whole sequence's
        tok_lr = torch.where(span_t, tok_span_lr, ls - b.g)
        log_w = torch.where(seq_t, (lsum - b.gsum)[:, None], tok_lr)
        raw_w = torch.exp(log_w.clamp(max=math.log(C) + 1.0))  # capped just above C: no inf
        weight = torch.minimum(raw_w, cap)                     # min(exp(sg(ℓ) − g), C or the foreign cap)
        truncated = m & (raw_w >= C)
        capped = (m & capped_row[:, None] & (raw_w > cap)).any(-1)   # the foreign cap lowered a weight

        # token level: mean of per-token k3; span level: each token carries its span's k3
        kl_tok = torch.where(m, _k3(-tok_lr), 0.0).sum(-1) / n_f
        # sequence level: k3 of the per-token mean log-ratio (the raw sum's k3 explodes with length)
        kl_seq = _k3((b.gsum - lsum) / n_f)
        kl = torch.where(empty, 0.0, torch.where(b.seq, kl_seq, kl_tok))

        adv_le0 = A <= 0
        kl_gt = kl > kl_threshold
        dropped = filter_dropped(A, kl, kl_threshold) if method.startswith("f-") else torch.zeros_like(adv_le0)
        adv = torch.where(dropped, 0.0, A)
        kept = ~dropped & ~empty
    return OffPolicy(ls=ls, span_lr=span_lr, tok_span_lr=tok_span_lr, weight=weight, truncated=truncated,
                     capped=capped, kl=kl, empty=empty, adv_le0=adv_le0, kl_gt=kl_gt, dropped=dropped, adv=adv,
                     kept=kept)


def _token_term(method, b: Prepared, l, w: OffPolicy, cap, eps, foreign_cap):
    """The per-token term (with grad through ℓ only) and where the clip is active: ([B,T], [B,T] bool)."""
    m = b.mask
    a = w.adv[:, None]
    base = method.removeprefix("f-")
    clip_active = torch.zeros_like(m)
    if base == "nois":
        R = torch.exp(l - l.detach())                          # decoupled ratio: value 1, grad ∇ℓ
        term = -R * a
    elif base == "tis":
        R = torch.exp(l - l.detach())
        term = -w.weight * torch.minimum(R * a, R.clamp(1 - eps, 1 + eps) * a)
        clip_active = m & (((a > 0) & (R > 1 + eps)) | ((a < 0) & (R < 1 - eps)))
    else:  # vis: ρ = exp(ℓ − sg(g)); sequence level: per-token geometric mean (GSPO-style)
        # span level: value = the span's ratio, gradient ρ_k ∇ℓ_t (so ρ_k ∇L_k per span, counted once)
        n_f = b.n.clamp(min=1).to(torch.float32)
        log_rho = torch.where(b.seq[:, None], ((l.sum(-1) - b.gsum) / n_f)[:, None],
                              torch.where(b.span[:, None], l - w.ls + w.tok_span_lr, l - b.g))
        rho = torch.exp(log_rho.clamp(-VIS_LOG_RATIO_CLAMP, VIS_LOG_RATIO_CLAMP))
        if foreign_cap is None:
            hi, clipped = 1 + eps, rho.clamp(1 - eps, 1 + eps)
        else:   # another model's rows: the upper clip is min(1 + eps, foreign_cap)
            hi = torch.minimum(cap, torch.full_like(cap, 1 + eps))
            clipped = torch.minimum(rho.clamp(min=1 - eps), hi)
        term = -torch.minimum(rho * a, clipped * a)
        clip_active = m & (((a > 0) & (rho > hi)) | ((a < 0) & (rho < 1 - eps)))
    return term, clip_active


def _divisor(normalize, num_samples, B: int, n_kept: int) -> int:
    """N of the loss: the batch (or num_samples) with "all", the kept samples with "kept"."""
    if normalize == "all":
        N = B if num_samples is None else num_samples
        if N < B:
            raise ObjectiveError(f"num_samples={N} is smaller than this call's batch ({B}); "
                                 "pass the full batch's sample count")
    else:
        N = n_kept if num_samples is None else num_samples
        if N < n_kept:
            raise ObjectiveError(f"num_samples={N} is smaller than the {n_kept} samples kept in this call; "
                                 "with normalize='kept' pass the total kept count of the full batch")
    return N


def ess_fraction(weights) -> float:
    """Effective sample size of importance weights as a fraction of their number:
    (Σw)² / (n Σw²), 1 when all are equal, 1/n when one dominates; 0 when all are 0, NaN for none."""
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if not w.numel():
        return float("nan")
    sq = float((w ** 2).sum())
    return float(w.sum() ** 2 / (w.numel() * sq)) if sq > 0 else 0.0


def _stats(loss, b: Prepared, empty, kl, adv_le0, kl_gt, dropped, adv, weight, truncated, ls, clip_active,
           span_lr, foreign_row, capped) -> dict:
    """Reporting numbers (floats; NaN where there is nothing to measure, stored as null)."""
    nan = float("nan")
    B, m, seq, span, n, g, n_k = b.B, b.mask, b.seq, b.span, b.n, b.g, b.n_k
    with torch.no_grad():
        n_f = n.clamp(min=1).to(torch.float32)
        nonempty = ~empty
        tokens = int(n.sum())
        w_sample = torch.where(m, weight, 0.0).sum(-1) / n_f
        w_ne = w_sample[nonempty].double()
        kl_ne = kl[nonempty]
        tok_rows = m & ~seq[:, None] & ~span[:, None]
        spans_used = (n_k > 0) & span[:, None]
        n_spans = int(spans_used.sum())
        n_tok = int(tok_rows.sum())
        ess = ess_fraction(w_ne)
        stats = {
            "loss": float(loss.detach()),
            "samples": float(B),
            "tokens": float(tokens),
            "samples/empty": float(empty.sum()),
            "samples/sequence_level": float(seq.sum()),
            "samples/span_level": float(span.sum()),
            "samples/foreign": float(foreign_row.sum()),
            "spans": float(n_spans),
            "filter/dropped": float(dropped.sum()),
            "filter/dropped_frac": float(dropped.sum()) / B,
            "filter/kept": float((~dropped & nonempty).sum()),
            "filter/adv_le0_frac": float(adv_le0.sum()) / B,
            "filter/kl_gt_g_frac": float(kl_gt.sum()) / B,
            "filter/adv_le0": float(adv_le0.sum()),
            "filter/kl_gt_g": float(kl_gt.sum()),
            "sampling/importance_sampling_ratio/mean": float(w_ne.mean()) if w_ne.numel() else nan,
            "sampling/importance_sampling_ratio/max": float(weight[m].max()) if tokens else nan,
            "is/truncated_frac": float(truncated.sum()) / tokens if tokens else nan,
            "is/foreign_capped": float(capped.sum()),
            "is/ess": ess,
            "kl/mean": float(kl_ne.mean()) if kl_ne.numel() else nan,
            "kl/max": float(kl_ne.max()) if kl_ne.numel() else nan,
            "sampling/sampling_logp_difference/mean": float(torch.where(tok_rows, (ls - g).abs(), 0.0).sum()) / n_tok
            if n_tok else nan,
            "sampling/span_logp_difference/mean": float(torch.where(spans_used, span_lr.abs(), 0.0).sum())
            / n_spans if n_spans else nan,
            "clip_ratio/region_mean": float(clip_active.sum()) / tokens if tokens else nan,
        }
        stats["per_sample"] = {
            "kl": kl.detach().clone(),
            "is_weight": w_sample.detach(),
            "dropped": dropped.detach().clone(),
            "advantage": adv.detach().clone(),
            "tokens": n.detach().clone(),
            "sequence_level": seq.detach().clone(),
            "span_level": span.detach().clone(),
            "foreign": foreign_row.detach().clone(),
            "capped": capped.detach().clone(),
        }
    return stats
