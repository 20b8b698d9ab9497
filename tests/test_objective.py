"""F-TIS objective: hand-computed values, analytic gradients, invariants, bad input, properties.

Hand values are written as arithmetic (math.exp ...) from docs/ftis.md, never copied outputs.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ftis_edge.errors import FtisError
from ftis_edge.learn.objective import (METHODS, ObjectiveError, ess_fraction, filter_dropped, ftis_loss,
                                 group_advantages, kl_k3)

torch.set_num_threads(1)
NAN, INF = float("nan"), float("inf")


def k3(d):  # d = g − ℓ
    return math.exp(d) - d - 1


# A tiny batch used throughout: 2 samples, sample 0 has 2 tokens (+1 padding column holding NaN).
L = [[-1.0, -2.0, NAN], [-0.5, -3.0, -1.0]]
G = [[-1.5, -1.0, NAN], [-0.1, -0.2, -4.0]]
M = [[1, 1, 0], [1, 1, 1]]
ADV = [1.5, -0.5]
# ℓ − g per token: sample 0: [0.5, −1.0]; sample 1: [−0.4, −2.8, 3.0]


def tiny(**kw):
    logp = torch.tensor(L, requires_grad=True)
    loss, stats = ftis_loss(logp, torch.tensor(G), torch.tensor(ADV), torch.tensor(M), **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, stats


def approx(x, rel=1e-5, abs=1e-6):
    return pytest.approx(x, rel=rel, abs=abs)


def assert_values(tensor, expected):
    """tensor (float32) equals a nested list of hand-computed floats."""
    torch.testing.assert_close(tensor.double(), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- advantages

def test_group_advantages_std_uses_sample_std():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    mean = 0.25
    std = math.sqrt(((1 - mean) ** 2 + 3 * mean ** 2) / 3)  # Bessel: n − 1 = 3
    assert adv.tolist() == approx([(1 - mean) / (std + 1e-4)] + [-mean / (std + 1e-4)] * 3)
    assert adv.dtype == torch.float32


def test_group_advantages_none_is_centered():
    assert group_advantages([2.0, 0.0, 1.0], scale="none").tolist() == approx([1.0, -1.0, 0.0])


@pytest.mark.parametrize("rewards", [[1.0] * 5, [0.0] * 3, [0.1] * 7, [0.3]])
@pytest.mark.parametrize("scale", ["std", "none"])
def test_equal_rewards_give_exact_zeros(rewards, scale):
    adv = group_advantages(rewards, scale=scale)
    assert torch.equal(adv, torch.zeros(len(rewards)))  # exact, and never NaN for one element


@pytest.mark.parametrize("rewards,scale", [([], "std"), ([[1.0, 2.0]], "std"), ([1.0, NAN], "std"),
                                          ([1.0, 0.0], "mad"), ("abc", "std")])
def test_group_advantages_bad_input(rewards, scale):
    with pytest.raises(ObjectiveError):
        group_advantages(rewards, scale=scale)


# --------------------------------------------------------------------------- k3 KL

def test_kl_k3_hand_values_and_no_grad():
    logp = torch.tensor(L, requires_grad=True)
    kl = kl_k3(logp, torch.tensor(G), torch.tensor(M))
    assert not kl.requires_grad
    assert kl.tolist() == approx([(k3(-0.5) + k3(1.0)) / 2, (k3(0.4) + k3(2.8) + k3(-3.0)) / 3])


def test_kl_k3_empty_sample_is_zero():
    kl = kl_k3(torch.tensor([[-1.0, NAN]]), torch.tensor([[-3.0, NAN]]), torch.tensor([[0, 0]]))
    assert kl.tolist() == [0.0]


# --------------------------------------------------------------------------- hand values

E = math.exp
# truncated weights min(exp(ℓ − g), 2)
W0 = [min(E(0.5), 2.0), min(E(-1.0), 2.0)]
W1 = [min(E(-0.4), 2.0), min(E(-2.8), 2.0), min(E(3.0), 2.0)]
KL0 = (k3(-0.5) + k3(1.0)) / 2          # ≈ 0.41
KL1 = (k3(0.4) + k3(2.8) + k3(-3.0)) / 3  # ≈ 4.93
TIS0 = -1.5 * sum(W0) / 2
TIS1 = +0.5 * sum(W1) / 3
# vis, Â > 0: −Â·min(ρ, 1.2); Â < 0: −Â·max(ρ, 0.8)
VIS0 = -1.5 * (min(E(0.5), 1.2) + min(E(-1.0), 1.2)) / 2
VIS1 = +0.5 * (max(E(-0.4), 0.8) + max(E(-2.8), 0.8) + max(E(3.0), 0.8)) / 3


@pytest.mark.parametrize("method,kl_threshold,expected", [
    ("nois", 5.0, (-1.5 + 0.5) / 2),
    ("tis", 5.0, (TIS0 + TIS1) / 2),
    ("vis", 5.0, (VIS0 + VIS1) / 2),
    ("f-tis", 5.0, (TIS0 + TIS1) / 2),    # KL1 ≈ 4.93 < 5: nothing dropped
    ("f-tis", 1.0, (TIS0 + 0.0) / 2),     # sample 1 (Â < 0, KL > 1) dropped, still counts in N
    ("f-vis", 5.0, (VIS0 + VIS1) / 2),
    ("f-vis", 1.0, (VIS0 + 0.0) / 2),
    ("f-tis", 0.0, (TIS0 + 0.0) / 2),     # sample 0 has KL > 0 but Â > 0: kept
])
def test_hand_values_token_level(method, kl_threshold, expected):
    loss, _, stats = tiny(method=method, kl_threshold=kl_threshold)
    assert loss == approx(expected)
    assert stats["loss"] == approx(expected)
    assert stats["kl/mean"] == approx((KL0 + KL1) / 2)
    assert stats["kl/max"] == approx(KL1)


def test_normalize_kept_divides_by_kept():
    loss_kept, _, stats = tiny(method="f-tis", kl_threshold=1.0, normalize="kept")
    assert loss_kept == approx(TIS0 / 1)
    assert stats["filter/kept"] == 1.0
    loss_all, _, _ = tiny(method="f-tis", kl_threshold=1.0, normalize="all")
    assert loss_all * 2 == approx(loss_kept * 1)


def test_stats_hand_values():
    _, _, s = tiny(method="f-tis", kl_threshold=1.0)
    assert s["samples"] == 2.0 and s["tokens"] == 5.0
    assert s["filter/dropped"] == 1.0 and s["filter/dropped_frac"] == 0.5
    assert s["filter/adv_le0_frac"] == 0.5 and s["filter/kl_gt_g_frac"] == 0.5
    assert s["filter/adv_le0"] == 1.0 and s["filter/kl_gt_g"] == 1.0
    w_samples = [sum(W0) / 2, sum(W1) / 3]
    assert s["sampling/importance_sampling_ratio/mean"] == approx(sum(w_samples) / 2)
    assert s["sampling/importance_sampling_ratio/max"] == approx(2.0)
    assert s["is/truncated_frac"] == approx(1 / 5)   # only exp(3.0) hits C
    assert s["is/ess"] == approx(sum(w_samples) ** 2 / (2 * sum(w * w for w in w_samples)))
    assert s["sampling/sampling_logp_difference/mean"] == approx((0.5 + 1.0 + 0.4 + 2.8 + 3.0) / 5)
    assert s["clip_ratio/region_mean"] == 0.0
    ps = s["per_sample"]
    assert ps["dropped"].tolist() == [False, True]
    assert ps["advantage"].tolist() == [1.5, 0.0]
    assert ps["kl"].tolist() == approx([KL0, KL1])
    assert ps["is_weight"].tolist() == approx(w_samples)
    assert ps["tokens"].tolist() == [2, 3]
    for key, value in s.items():
        if key != "per_sample":
            assert isinstance(value, float), key


def test_vis_clip_frac():
    # sample 0 (Â > 0): ρ = e^0.5 > 1.2 clipped; sample 1 (Â < 0): e^−0.4, e^−2.8 < 0.8 clipped
    _, _, s = tiny(method="vis")
    assert s["clip_ratio/region_mean"] == approx(3 / 5)


def test_hand_values_sequence_level():
    # sample 0's text re-tokenized locally (ℓ = [−1, −2]); the peer's own sum is −2.2
    logp = torch.tensor(L, requires_grad=True)
    gsum = torch.tensor([-2.2, -6.0])
    args = (logp, torch.full((2, 3), NAN), torch.tensor(ADV), torch.tensor(M))
    lsum = [-3.0, -4.5]
    w = [min(E(lsum[0] + 2.2), 2.0), min(E(lsum[1] + 6.0), 2.0)]
    delta = [(-2.2 - lsum[0]) / 2, (-6.0 - lsum[1]) / 3]
    loss, s = ftis_loss(*args, method="tis", level="sequence", gen_logp_sum=gsum)
    assert loss.item() == approx((-1.5 * w[0] + 0.5 * w[1]) / 2)
    assert s["per_sample"]["kl"].tolist() == approx([k3(d) for d in delta])
    assert s["per_sample"]["is_weight"].tolist() == approx(w)
    assert math.isnan(s["sampling/sampling_logp_difference/mean"])  # no token-level samples to compare
    rho = [E((lsum[0] + 2.2) / 2), E((lsum[1] + 6.0) / 3)]
    loss, _ = ftis_loss(*args, method="vis", level="sequence", gen_logp_sum=gsum)
    vis0 = -1.5 * min(rho[0], 1.2)
    vis1 = 0.5 * max(rho[1], 0.8)
    assert loss.item() == approx((vis0 + vis1) / 2)
    # with gen_logp_sum None the sum of gen_logp over the mask is used
    loss, s = ftis_loss(logp, torch.tensor(G), torch.tensor(ADV), torch.tensor(M), method="tis",
                        level="sequence")
    w = [min(E(-3.0 + 2.5), 2.0), min(E(-4.5 + 4.3), 2.0)]
    assert loss.item() == approx((-1.5 * w[0] + 0.5 * w[1]) / 2)


# --------------------------------------------------------------------------- span level
# Sample 0's two learner tokens form one span whose bytes the peer gave −2.2 (as the sequence
# test above); sample 1's tokens are split [0 | 1 1], the peer's span sums are −0.1 and −3.5.
SPAN_IDS = [[0, 0, -7], [0, 1, 1]]         # −7 sits on padding: never read
SPAN_G = [[-2.2, NAN], [-0.1, -3.5]]        # sample 0 has one span: the second slot is padding
# L_k − G_k: sample 0: −3 + 2.2 = −0.8; sample 1: −0.5 + 0.1 = −0.4, −4 + 3.5 = −0.5


def span_call(method, **kw):
    logp = torch.tensor(L, requires_grad=True)
    loss, stats = ftis_loss(logp, torch.full((2, 3), NAN), torch.tensor(ADV), torch.tensor(M),
                            method=method, level="span", span_ids=torch.tensor(SPAN_IDS),
                            gen_span_logp=torch.tensor(SPAN_G), **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, stats


def test_hand_values_span_level():
    w0, w10, w11 = E(-0.8), E(-0.4), E(-0.5)
    loss, grad, s = span_call("tis")
    assert loss == approx((0.5 * (-1.5) * (w0 + w0) + (0.5 / 3) * (w10 + w11 + w11)) / 2)
    assert_values(grad, [[-1.5 * w0 / 2 / 2] * 2 + [0.0], [0.5 * w10 / 3 / 2, 0.5 * w11 / 3 / 2,
                                                           0.5 * w11 / 3 / 2]])
    kl = [k3(0.8), (k3(0.4) + 2 * k3(0.5)) / 3]     # each token carries its span's k3(G_k − L_k)
    assert s["per_sample"]["kl"].tolist() == approx(kl)
    assert s["per_sample"]["is_weight"].tolist() == approx([w0, (w10 + 2 * w11) / 3])
    assert s["per_sample"]["span_level"].tolist() == [True, True]
    assert (s["samples/span_level"], s["spans"]) == (2.0, 3.0)
    assert s["sampling/span_logp_difference/mean"] == approx((0.8 + 0.4 + 0.5) / 3)
    assert math.isnan(s["sampling/sampling_logp_difference/mean"])
    # the filter sees the span k3: sample 1 (Â < 0) is dropped at g = 0.1 < 0.1298, kept at 0.2
    _, _, s = span_call("f-tis", kl_threshold=0.1)
    assert s["per_sample"]["dropped"].tolist() == [False, True]
    _, _, s = span_call("f-tis", kl_threshold=0.2)
    assert s["per_sample"]["dropped"].tolist() == [False, False]


def test_vis_span_level_hand_values_and_gradient():
    # sample 0 (Â > 0): ρ = e^−0.8 inside; sample 1 (Â < 0): e^−0.4, e^−0.5 < 0.8 clipped → term 0.4
    loss, grad, s = span_call("vis")
    assert loss == approx((-1.5 * E(-0.8) + 0.4) / 2)
    # each token's gradient is −Â ρ_k / |a| / N: the span's ratio, counted once per token
    assert_values(grad, [[-1.5 * E(-0.8) / 2 / 2] * 2 + [0.0], [0.0] * 3])
    assert s["clip_ratio/region_mean"] == approx(3 / 5)


@pytest.mark.parametrize("method", METHODS)
def test_one_token_spans_equal_token_level(method):
    logp, gen_logp, adv, mask = rand_batch(B=6, seed=11, spread=1.5)
    B, T = logp.shape
    tok = loss_and_grad(logp, gen_logp, adv, mask, method=method, kl_threshold=0.3)
    span = loss_and_grad(logp, torch.full((B, T), NAN), adv, mask, method=method, kl_threshold=0.3,
                         level="span", span_ids=torch.arange(T).repeat(B, 1),
                         gen_span_logp=torch.where(mask, gen_logp, NAN))
    assert torch.allclose(tok[0], span[0], atol=1e-6)
    assert torch.allclose(tok[1], span[1], atol=1e-7)
    for key in ("kl", "is_weight", "dropped"):
        assert torch.allclose(tok[2]["per_sample"][key].float(), span[2]["per_sample"][key].float(), atol=1e-6)
    assert span[2]["sampling/span_logp_difference/mean"] == approx(tok[2]["sampling/sampling_logp_difference/mean"])


@pytest.mark.parametrize("method", ["nois", "tis"])
def test_one_span_per_sample_has_the_sequence_weight(method):
    # one span over the whole completion: the same weight and gradient as the sequence level
    # (the k3 differs by design: the span's k3 of the sum vs the sequence's k3 of the mean)
    logp, gen_logp, adv, mask = rand_batch(B=5, seed=12, spread=0.3)
    gsum = torch.where(mask, gen_logp, 0.0).sum(-1)
    B, T = logp.shape
    seq = loss_and_grad(logp, gen_logp, adv, mask, method=method, level="sequence", gen_logp_sum=gsum)
    span = loss_and_grad(logp, gen_logp, adv, mask, method=method, level="span",
                         span_ids=torch.zeros(B, T, dtype=torch.long), gen_span_logp=gsum[:, None])
    assert torch.allclose(seq[0], span[0], atol=1e-6)
    assert torch.allclose(seq[1], span[1], atol=1e-7)
    assert torch.allclose(seq[2]["per_sample"]["is_weight"], span[2]["per_sample"]["is_weight"], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_mixed_three_levels_equal_sum_of_separate_calls(method):
    logp, gen_logp, adv, mask = rand_batch(B=6, seed=13, spread=1.0)
    B, T = logp.shape
    code = torch.tensor([0, 2, 1, 2, 0, 1])
    span_ids = (torch.arange(T) // 2).repeat(B, 1)                   # pairs of tokens
    gen_span = torch.zeros(B, (T + 1) // 2).scatter_add(1, span_ids, torch.where(mask, gen_logp, 0.0)) - 0.2
    gsum = torch.where(mask, gen_logp, 0.0).sum(-1) - 0.3
    kw = dict(method=method, kl_threshold=0.3, gen_logp_sum=gsum, span_ids=span_ids, gen_span_logp=gen_span)
    mixed = loss_and_grad(logp, torch.where((code == 0)[:, None], gen_logp, NAN), adv, mask, level=code, **kw)
    total = torch.zeros(())
    for lv, name in enumerate(("token", "sequence", "span")):
        r = code == lv
        part = loss_and_grad(logp[r], gen_logp[r], adv[r], mask[r], method=method, kl_threshold=0.3,
                             level=name, gen_logp_sum=gsum[r], span_ids=span_ids[r],
                             gen_span_logp=gen_span[r], num_samples=B)
        total = total + part[0]
        assert torch.allclose(mixed[1][r], part[1], atol=1e-7)
    assert torch.allclose(mixed[0], total, atol=1e-6)
    assert (mixed[2]["samples/sequence_level"], mixed[2]["samples/span_level"]) == (2.0, 2.0)


def test_span_padding_garbage_is_ignored():
    loss, grad, _ = span_call("f-tis", kl_threshold=0.1)
    logp = torch.tensor(L, requires_grad=True)
    ids = torch.tensor(SPAN_IDS)
    ids[0, 2] = 10 ** 6                                  # out of range, but on padding
    ref, _ = ftis_loss(logp, torch.full((2, 3), INF), torch.tensor(ADV), torch.tensor(M), method="f-tis",
                       kl_threshold=0.1, level="span", span_ids=ids,
                       gen_span_logp=torch.tensor([[-2.2, INF, 5.0], [-0.1, -3.5, NAN]]))
    assert ref.item() == approx(loss)


# --------------------------------------------------------------------------- gradients

def test_tis_gradient_is_analytic():
    _, grad, _ = tiny(method="tis")
    expected = [[-1.5 * W0[0] / 2 / 2, -1.5 * W0[1] / 2 / 2, 0.0],
                [0.5 * W1[0] / 3 / 2, 0.5 * W1[1] / 3 / 2, 0.5 * W1[2] / 3 / 2]]
    assert_values(grad, expected)


def test_nois_gradient_is_analytic():
    _, grad, _ = tiny(method="nois")
    assert_values(grad, [[-1.5 / 2 / 2] * 2 + [0.0], [0.5 / 3 / 2] * 3])


def test_vis_gradient_inside_and_outside_clip():
    # inside the clip: −Â ρ / |a| / N; clipped tokens: 0
    _, grad, _ = tiny(method="vis")
    expected = [[0.0, -1.5 * E(-1.0) / 2 / 2, 0.0],          # e^0.5 > 1.2 clipped; e^−1 inside (Â>0)
                [0.0, 0.0, 0.5 * E(3.0) / 3 / 2]]            # ρ < 0.8 clipped; e^3 inside (Â<0)
    assert_values(grad, expected)


def test_sequence_level_gradients():
    logp = torch.tensor(L, requires_grad=True)
    gsum = torch.tensor([-2.2, -6.0])
    args = (logp, torch.zeros(2, 3), torch.tensor(ADV), torch.tensor(M))
    loss, _ = ftis_loss(*args, method="tis", level="sequence", gen_logp_sum=gsum)
    (grad,) = torch.autograd.grad(loss, logp)
    w = [min(E(-3.0 + 2.2), 2.0), min(E(-4.5 + 6.0), 2.0)]
    assert_values(grad, [[-1.5 * w[0] / 2 / 2] * 2 + [0.0], [0.5 * w[1] / 3 / 2] * 3])
    loss, _ = ftis_loss(*args, method="vis", level="sequence", gen_logp_sum=gsum)
    (grad,) = torch.autograd.grad(loss, logp)
    rho0 = E((-3.0 + 2.2) / 2)  # 0.67: inside for Â > 0
    # sample 1: ρ = e^0.5 > 0.8 with Â < 0: inside, grad −Â ρ / |a| / N
    assert_values(grad, [[-1.5 * rho0 / 2 / 2] * 2 + [0.0], [0.5 * E(0.5) / 3 / 2] * 3])


# --------------------------------------------------------------------------- invariants

def rand_batch(B=5, T=7, seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=gen) * 3
    gen_logp = (logp + torch.randn(B, T, generator=gen) * spread).clamp(max=0)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=gen)
    return logp, gen_logp, adv, mask


def loss_and_grad(logp, *args, **kw):
    logp = logp.clone().requires_grad_(True)
    loss, stats = ftis_loss(logp, *args, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_on_policy_methods_agree(level):
    logp, _, adv, mask = rand_batch()
    results = [loss_and_grad(logp, logp.clone(), adv, mask, method=m, level=level)
               for m in ("nois", "tis", "vis", "f-tis", "f-vis")]
    for loss, grad, stats in results[1:]:
        assert torch.allclose(loss, results[0][0], atol=1e-6)
        assert torch.allclose(grad, results[0][1], atol=1e-6)
        assert stats["filter/dropped"] == 0.0 and stats["is/ess"] == approx(1.0)


def test_filter_never_drops_positive_advantage():
    logp = torch.full((4, 3), -20.0)
    gen_logp = torch.zeros(4, 3)                          # huge KL for every sample
    adv = torch.tensor([2.0, 1e-6, 0.0, -1.0])
    _, grad, s = loss_and_grad(logp, gen_logp, adv, torch.ones(4, 3), method="f-tis", kl_threshold=5.0)
    assert s["per_sample"]["dropped"].tolist() == [False, False, True, True]
    assert grad[0].abs().min() > 0 and grad[1].abs().min() > 0
    assert filter_dropped(torch.tensor([0.5, -0.5]), torch.tensor([1e9, 1e9]), 5.0).tolist() == [False, True]


def test_filtered_sample_counts_in_group_and_divisor():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards)
    logp, gen_logp, _, mask = rand_batch(B=5, T=4, seed=1, spread=0.1)
    gen_logp[1] = 0.0
    logp[1] = -15.0                                      # sample 1 (Â < 0) far off-policy
    loss, grad, s = loss_and_grad(logp, gen_logp, adv, mask, method="f-tis", kl_threshold=5.0)
    assert s["per_sample"]["dropped"].tolist() == [False, True, False, False, False]
    assert torch.equal(grad[1], torch.zeros(4))           # no gradient from the dropped sample
    keep = [0, 2, 3, 4]
    # the others keep the advantages of the whole group (the dropped reward still in mean/std)
    assert torch.equal(s["per_sample"]["advantage"][keep], adv[keep])
    # and the divisor is still N = 5: same as the kept samples alone with num_samples=5
    loss_k, grad_k, _ = loss_and_grad(logp[keep], gen_logp[keep], adv[keep], mask[keep],
                                      method="f-tis", num_samples=5)
    assert torch.allclose(loss, loss_k, atol=1e-6)
    assert torch.allclose(grad[keep], grad_k, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_padding_never_changes_result(method, level):
    logp, gen_logp, adv, mask = rand_batch(seed=2)
    base = loss_and_grad(logp, gen_logp, adv, mask, method=method, level=level, kl_threshold=0.3)
    garbage = torch.tensor([NAN, -INF, INF, 1e30, 3.0])
    B, T = logp.shape
    pad = garbage.repeat(B, 1)
    # also overwrite the existing padding inside the original width
    logp_p = torch.where(mask, logp, NAN)
    gen_p = torch.where(mask, gen_logp, INF)
    padded = loss_and_grad(torch.cat([logp_p, pad], 1), torch.cat([gen_p, pad.flip(1)], 1), adv,
                           torch.cat([mask, torch.zeros(B, 5, dtype=torch.bool)], 1),
                           method=method, level=level, kl_threshold=0.3)
    # equal up to float32 summation order (a longer row is reduced in a different order)
    torch.testing.assert_close(padded[0], base[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(padded[1][:, :T], base[1], rtol=1e-6, atol=1e-7)
    assert torch.equal(padded[1][:, T:], torch.zeros(B, 5))
    assert torch.isfinite(padded[1]).all()


def test_equal_reward_group_gives_zero_loss_and_gradient():
    adv = group_advantages(torch.ones(4))
    logp, gen_logp, _, mask = rand_batch(B=4, seed=3)
    for method in METHODS:
        loss, grad, _ = loss_and_grad(logp, gen_logp, adv, mask, method=method)
        assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("normalize", ["all", "kept"])
@pytest.mark.parametrize("method", ["f-tis", "f-vis", "nois"])
def test_micro_batches_sum_to_full_batch(normalize, method):
    logp, gen_logp, adv, mask = rand_batch(B=7, seed=4, spread=2.0)
    full_loss, full_grad, s = loss_and_grad(logp, gen_logp, adv, mask, method=method,
                                            kl_threshold=0.5, normalize=normalize)
    if method.startswith("f-"):
        assert 0 < s["filter/dropped"] < 7  # the split must matter
    N = 7 if normalize == "all" else int(s["filter/kept"])
    total, grads = 0.0, []
    for idx in ([0, 1], [2, 3, 4], [5, 6]):
        loss, grad, _ = loss_and_grad(logp[idx], gen_logp[idx], adv[idx], mask[idx], method=method,
                                      kl_threshold=0.5, normalize=normalize, num_samples=N)
        total, grads = total + loss, grads + [grad]
    assert torch.allclose(total, full_loss, atol=1e-6)
    assert torch.allclose(torch.cat(grads), full_grad, atol=1e-7)


def test_kept_normalisation_by_rescaling_accumulated_all():
    # documented recipe (b): accumulate with normalize="all", num_samples=B, then scale by B / kept
    logp, gen_logp, adv, mask = rand_batch(B=6, seed=11, spread=2.0)
    level = torch.tensor([True, False, False, True, False, False])
    kw = dict(method="f-tis", kl_threshold=0.5, level=level)
    full_loss, full_grad, _ = loss_and_grad(logp, gen_logp, adv, mask, normalize="kept", **kw)
    total, grads, kept = 0.0, [], 0.0
    for idx in ([0, 1, 2], [3, 4, 5]):
        loss, grad, s = loss_and_grad(logp[idx], gen_logp[idx], adv[idx], mask[idx], num_samples=6,
                                      **{**kw, "level": level[idx]})
        total, grads, kept = total + loss, grads + [grad], kept + s["filter/kept"]
    assert 0 < kept < 6
    torch.testing.assert_close(total * 6 / kept, full_loss)
    torch.testing.assert_close(torch.cat(grads) * 6 / kept, full_grad)


@pytest.mark.parametrize("method", METHODS)
def test_single_token_sequence_level_equals_token_level(method):
    logp, gen_logp, adv, _ = rand_batch(B=6, T=3, seed=5, spread=1.5)
    mask = torch.zeros(6, 3, dtype=torch.bool)
    mask[:, 0] = True
    tok = loss_and_grad(logp, gen_logp, adv, mask, method=method, kl_threshold=0.2)
    seq = loss_and_grad(logp, gen_logp, adv, mask, method=method, kl_threshold=0.2, level="sequence",
                        gen_logp_sum=gen_logp[:, 0].clone())
    assert torch.allclose(tok[0], seq[0], atol=1e-6)
    assert torch.allclose(tok[1], seq[1], atol=1e-7)
    for key in ("kl", "is_weight", "dropped"):
        assert torch.allclose(tok[2]["per_sample"][key].float(), seq[2]["per_sample"][key].float(), atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_mixed_level_equals_sum_of_separate_calls(method):
    logp, gen_logp, adv, mask = rand_batch(B=6, seed=6, spread=1.0)
    level = torch.tensor([False, True, False, True, True, False])
    gsum = torch.where(mask, gen_logp, 0.0).sum(-1) - 0.3     # the peer's own tokenization
    gen_mixed = torch.where(level[:, None], NAN, gen_logp)    # ignored for sequence-level rows
    mixed = loss_and_grad(logp, gen_mixed, adv, mask, method=method, level=level, gen_logp_sum=gsum,
                          kl_threshold=0.3)
    t, s = ~level, level
    tok = loss_and_grad(logp[t], gen_logp[t], adv[t], mask[t], method=method, level="token",
                        num_samples=6, kl_threshold=0.3)
    sq = loss_and_grad(logp[s], gen_logp[s], adv[s], mask[s], method=method, level="sequence",
                       gen_logp_sum=gsum[s], num_samples=6, kl_threshold=0.3)
    assert torch.allclose(mixed[0], tok[0] + sq[0], atol=1e-6)
    assert torch.allclose(mixed[1][t], tok[1], atol=1e-7)
    assert torch.allclose(mixed[1][s], sq[1], atol=1e-7)
    assert mixed[2]["samples/sequence_level"] == 3.0


def test_zero_length_sample_contributes_nothing_and_is_reported():
    logp, gen_logp, adv, mask = rand_batch(B=3, seed=7)
    mask[1] = False
    loss, grad, s = loss_and_grad(logp, gen_logp, adv, mask, method="tis")
    assert s["samples/empty"] == 1.0
    assert torch.count_nonzero(grad[1]) == 0
    keep = [0, 2]
    loss_k, _, _ = loss_and_grad(logp[keep], gen_logp[keep], adv[keep], mask[keep], method="tis",
                                 num_samples=3)
    assert torch.allclose(loss, loss_k)
    _, _, s_kept = loss_and_grad(logp, gen_logp, adv, mask, method="tis", normalize="kept")
    assert s_kept["filter/kept"] == 2.0  # an empty sample is not counted as kept


def test_all_dropped_with_kept_normalisation_is_zero_not_nan():
    logp = torch.full((2, 2), -20.0)
    loss, grad, s = loss_and_grad(logp, torch.zeros(2, 2), torch.tensor([-1.0, -2.0]), torch.ones(2, 2),
                                  method="f-tis", normalize="kept")
    assert s["filter/dropped"] == 2.0 and loss.item() == 0.0 and torch.count_nonzero(grad) == 0


def test_bfloat16_input_computes_in_float32():
    logp, gen_logp, adv, mask = rand_batch(seed=8)
    lb, gb = logp.bfloat16(), gen_logp.bfloat16()
    ref_loss, ref_grad, _ = loss_and_grad(lb.float(), gb.float(), adv, mask, method="f-tis")
    lb = lb.clone().requires_grad_(True)
    loss, _ = ftis_loss(lb, gb, adv, mask, method="f-tis")
    (grad,) = torch.autograd.grad(loss, lb)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert torch.allclose(loss, ref_loss)
    assert torch.allclose(grad.float(), ref_grad.bfloat16().float())


def test_float_mask_and_stats_for_nois():
    logp, gen_logp, adv, mask = rand_batch(seed=9, spread=2.0)
    a = loss_and_grad(logp, gen_logp, adv, mask.float(), method="nois")
    b = loss_and_grad(logp, gen_logp, adv, mask, method="nois")
    assert torch.equal(a[0], b[0])
    # IS stats still reported for nois: weight = min(exp(ℓ − g), C)
    w = torch.exp(logp - gen_logp).clamp(max=2.0)
    assert a[2]["sampling/importance_sampling_ratio/max"] == approx(float(w[mask].max()))
    assert a[2]["clip_ratio/region_mean"] == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    logp, gen_logp, adv, mask = rand_batch(seed=10, spread=2.0)
    cpu = loss_and_grad(logp, gen_logp, adv, mask, method="f-tis", kl_threshold=0.5)
    cuda = loss_and_grad(logp.cuda(), gen_logp.cuda(), adv.cuda(), mask.cuda(), method="f-tis",
                         kl_threshold=0.5)
    assert cuda[0].is_cuda and torch.allclose(cuda[0].cpu(), cpu[0], atol=1e-6)
    assert torch.allclose(cuda[1].cpu(), cpu[1], atol=1e-6)
    assert cuda[2]["filter/dropped"] == cpu[2]["filter/dropped"]


# --------------------------------------------------------------------------- bad input

def _good():
    return dict(logp=torch.tensor(L), gen_logp=torch.tensor(G), advantages=torch.tensor(ADV),
                mask=torch.tensor(M))


@pytest.mark.parametrize("change,message", [
    (dict(logp=torch.zeros(2, 4)), "gen_logp must have"),
    (dict(mask=torch.ones(3, 3)), "mask must have"),
    (dict(advantages=torch.ones(3)), "advantages must be"),
    (dict(logp=torch.zeros(6)), r"\[B, T\]"),
    (dict(logp=torch.zeros(0, 3), gen_logp=torch.zeros(0, 3), mask=torch.zeros(0, 3)), "empty batch"),
    (dict(logp=torch.tensor([[-1.0, NAN, 0.0], [-1.0, -1.0, -1.0]])), "non-finite"),
    (dict(logp=torch.tensor([[-1.0, -INF, 0.0], [-1.0, -1.0, -1.0]])), "non-finite"),
    (dict(logp=torch.tensor([[-1.0, 0.5, 0.0], [-1.0, -1.0, -1.0]])), "log-probabilities"),
    (dict(gen_logp=torch.tensor([[-1.0, -1.0, 0.0], [-1.0, INF, -1.0]])), "gen_logp has a non-finite"),
    (dict(gen_logp=torch.tensor([[-1.0, -1.0, 0.0], [-1.0, 2e-4, -1.0]])), "gen_logp must be log-prob"),
    (dict(advantages=torch.tensor([1.0, NAN])), "advantages must be finite"),
    (dict(mask=torch.tensor([[1, 2, 0], [1, 1, 1]])), "0/1"),
    (dict(mask=torch.tensor([[1.0, NAN, 0.0], [1.0, 1.0, 1.0]])), "0/1"),
    (dict(logp=L), "torch.Tensor"),
    (dict(method="tis2"), "unknown method"),
    (dict(method="nis"), "unknown method"),
    (dict(level="seq"), "unknown level"),
    (dict(level=torch.tensor([1.0, 0.0])), "bool"),
    (dict(level=torch.tensor([3, 0])), "level codes"),
    (dict(level="span"), "span_ids"),
    (dict(level="span", span_ids=torch.tensor([[0, 0, 0], [0, 1, 2]]), gen_span_logp=torch.zeros(2, 2)),
     r"span_ids must lie in \[0, 2\)"),
    (dict(level="span", span_ids=torch.zeros(2, 3), gen_span_logp=torch.zeros(2, 1)), "integer tensor"),
    (dict(level="span", span_ids=torch.zeros(2, 2, dtype=torch.long), gen_span_logp=torch.zeros(2, 1)),
     "integer tensor"),
    (dict(level="span", span_ids=torch.zeros(2, 3, dtype=torch.long), gen_span_logp=torch.zeros(2)),
     "gen_span_logp must be a float tensor"),
    (dict(level="span", span_ids=torch.tensor([[0, 1, 0], [0, 0, 0]]),
          gen_span_logp=torch.tensor([[-1.0, NAN], [-1.0, NAN]])), "gen_span_logp has a non-finite"),
    (dict(level="span", span_ids=torch.zeros(2, 3, dtype=torch.long),
          gen_span_logp=torch.tensor([[-1.0], [0.5]])), "gen_span_logp must be log"),
    (dict(level=torch.tensor([True])), "bool"),
    (dict(normalize="mean"), "unknown normalize"),
    (dict(C=0.0), "C"),
    (dict(C=INF), "C"),
    (dict(eps=1.5), "eps"),
    (dict(kl_threshold=NAN), "kl_threshold"),
    (dict(kl_threshold=-1.0), "kl_threshold"),
    (dict(num_samples=1), "num_samples=1 is smaller"),
    (dict(num_samples=2.0), "num_samples"),
    (dict(num_samples=True), "num_samples"),
    (dict(level="sequence", gen_logp_sum=torch.tensor([-1.0, NAN])), "gen_logp_sum has a non-finite"),
    (dict(level="sequence", gen_logp_sum=torch.tensor([-1.0, 0.5])), "gen_logp_sum must be log"),
    (dict(level="sequence", gen_logp_sum=torch.tensor([-1.0])), r"gen_logp_sum must be a float tensor"),
])
def test_bad_input_raises(change, message):
    """A clear one-line user error (FtisError: the CLI prints it as one line), not a traceback."""
    kwargs = {**_good(), **change}
    with pytest.raises(ObjectiveError, match=message) as err:
        ftis_loss(kwargs.pop("logp"), kwargs.pop("gen_logp"), kwargs.pop("advantages"),
                  kwargs.pop("mask"), **kwargs)
    assert isinstance(err.value, FtisError) and "\n" not in str(err.value)


def test_kept_num_samples_smaller_than_kept_raises():
    with pytest.raises(ObjectiveError, match="total kept count"):
        ftis_loss(torch.tensor(L), torch.tensor(G), torch.tensor(ADV), torch.tensor(M),
                  normalize="kept", num_samples=1, kl_threshold=100.0)


def test_ess_fraction():
    """(Σw)² / (n Σw²): 1 for equal weights, 1/n for one dominant weight; 0 all zero, NaN for none."""
    assert ess_fraction([0.5, 0.5, 0.5, 0.5]) == approx(1.0)
    assert ess_fraction([1.0, 0.0, 0.0, 0.0]) == approx(0.25)
    assert ess_fraction(torch.tensor([1.0, 3.0])) == approx(16 / (2 * 10))
    assert ess_fraction([0.0, 0.0]) == 0.0 and math.isnan(ess_fraction([]))


# --------------------------------------------------------------------------- properties

@st.composite
def batches(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 6))
    val = st.floats(-20.0, 0.0, allow_nan=False)
    logp = torch.tensor(draw(st.lists(st.lists(val, min_size=T, max_size=T), min_size=B, max_size=B)))
    gen_logp = torch.tensor(draw(st.lists(st.lists(val, min_size=T, max_size=T), min_size=B, max_size=B)))
    lengths = torch.tensor(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.tensor(draw(st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=B, max_size=B)))
    level = torch.tensor(draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    return logp, gen_logp, adv, mask, level


@settings(max_examples=150, deadline=None)
@given(batch=batches(), method=st.sampled_from(METHODS), normalize=st.sampled_from(["all", "kept"]),
       kl_threshold=st.sampled_from([0.0, 0.5, 5.0, INF]), pad=st.integers(1, 3))
def test_properties(batch, method, normalize, kl_threshold, pad):
    logp, gen_logp, adv, mask, level = batch
    kw = dict(method=method, normalize=normalize, kl_threshold=kl_threshold, level=level)
    loss, grad, s = loss_and_grad(logp, gen_logp, adv, mask, **kw)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    dropped = s["per_sample"]["dropped"]
    assert not dropped[adv > 0].any()
    assert torch.count_nonzero(grad[dropped]) == 0
    # garbage padding, both after the width and over the existing padded slots
    B, T = logp.shape
    junk = torch.tensor([NAN, INF, -INF])[torch.arange(pad) % 3].repeat(B, 1)
    zeros = torch.zeros(B, pad, dtype=torch.bool)
    loss_p, grad_p, _ = loss_and_grad(torch.cat([torch.where(mask, logp, NAN), junk], 1),
                                      torch.cat([torch.where(mask, gen_logp, 7.0), junk], 1), adv,
                                      torch.cat([mask, zeros], 1), **kw)
    # A wider tensor sums in another order: float32 may differ by a few ulps (a drawn case
    # reached 1.03e-6 relative); a NaN/Inf that leaked from the padding would not be close at all.
    torch.testing.assert_close(loss_p, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_p[:, :T], grad, rtol=1e-5, atol=1e-7)


@settings(max_examples=100, deadline=None)
@given(batch=batches(), method=st.sampled_from(METHODS), kl_threshold=st.sampled_from([0.0, 0.5, INF]),
       cuts=st.lists(st.booleans(), min_size=6, max_size=6), gen_shift=st.floats(-3.0, 0.0))
def test_span_level_properties(batch, method, kl_threshold, cuts, gen_shift):
    logp, gen_logp, adv, mask, _ = batch
    B, T = logp.shape
    # monotone span ids: a new span starts wherever cuts[t] is True (spans of 1..T tokens)
    starts = torch.tensor([False] + cuts[1:T])
    span_ids = torch.cumsum(starts.long(), 0).repeat(B, 1)
    S = int(span_ids.max()) + 1
    gen_span = torch.zeros(B, S).scatter_add(1, span_ids, torch.where(mask, gen_logp, 0.0)) + gen_shift
    kw = dict(method=method, kl_threshold=kl_threshold, level="span", span_ids=span_ids, gen_span_logp=gen_span)
    loss, grad, s = loss_and_grad(logp, gen_logp, adv, mask, **kw)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert not s["per_sample"]["dropped"][adv > 0].any()
    assert (s["per_sample"]["is_weight"] <= 2.0 + 1e-6).all() and (s["per_sample"]["kl"] >= 0).all()
    # garbage on padding (log-probs, span ids, unused span slots) changes nothing
    junk_ids = torch.where(mask, span_ids, 10 ** 6)
    loss_p, grad_p, _ = loss_and_grad(torch.where(mask, logp, NAN), torch.full((B, T), NAN), adv, mask,
                                      **{**kw, "span_ids": junk_ids,
                                         "gen_span_logp": torch.cat([gen_span, torch.full((B, 2), NAN)], 1)})
    torch.testing.assert_close(loss_p, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_p, grad, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- another model's samples

def test_foreign_cap_off_is_the_plain_objective_bit_for_bit():
    plain = tiny(method="f-tis", C=2.0)
    for kw in ({"foreign": torch.tensor([True, True])}, {"foreign_cap": 1.0},
               {"foreign": torch.tensor([False, False]), "foreign_cap": 1.0}):
        loss, grad, st = tiny(method="f-tis", C=2.0, **kw)
        assert loss == plain[0] and torch.equal(grad, plain[1])
        assert st["is/foreign_capped"] == 0


def test_foreign_cap_lowers_only_the_foreign_rows_weights():
    # ℓ − g: sample 0 [0.5, −1.0] (token 0 has weight e^0.5 = 1.65 < C = 2); sample 1 [−0.4, −2.8, 3.0]
    for foreign in ([True, False], [False, True]):
        loss, grad, st = tiny(method="tis", C=2.0, foreign=torch.tensor(foreign), foreign_cap=1.0)
        w0 = [min(math.exp(0.5), 1.0 if foreign[0] else 2.0), math.exp(-1.0)]
        w1 = [math.exp(-0.4), math.exp(-2.8), 1.0 if foreign[1] else 2.0]
        # tis's inner ratio is 1 in value, so the gradient is −w Â / |a_i| / N per token
        assert_values(grad, [[-w0[0] * 1.5 / 2 / 2, -w0[1] * 1.5 / 2 / 2, 0.0],
                             [w * 0.5 / 3 / 2 for w in w1]])
        assert st["per_sample"]["is_weight"].tolist() == approx([sum(w0) / 2, sum(w1) / 3])
        assert st["per_sample"]["capped"].tolist() == foreign      # each foreign row has a token > 1
        assert st["per_sample"]["foreign"].tolist() == foreign
        assert st["is/foreign_capped"] == 1 and st["samples/foreign"] == 1


def test_foreign_cap_stops_an_imitated_texts_weight_growing_toward_C():
    # the learner has come to like another model's text: ℓ − g = +0.6 on every token (w = 1.82 < C)
    g = torch.full((1, 4), -2.0)
    logp = (g + 0.6).requires_grad_()
    adv, mask = torch.tensor([1.0]), torch.ones(1, 4)
    _, plain = ftis_loss(logp, g, adv, mask, level="token")
    _, capped = ftis_loss(logp, g, adv, mask, level="token", foreign=torch.tensor([True]), foreign_cap=1.0)
    assert plain["per_sample"]["is_weight"].item() == approx(math.exp(0.6))
    assert capped["per_sample"]["is_weight"].item() == approx(1.0) and capped["is/foreign_capped"] == 1
    # a text it still finds unlikely keeps its (< 1) weight: the cap only bounds from above
    _, low = ftis_loss((g - 0.3).requires_grad_(), g, adv, mask, foreign=torch.tensor([True]), foreign_cap=1.0)
    assert low["per_sample"]["is_weight"].item() == approx(math.exp(-0.3)) and low["is/foreign_capped"] == 0


def test_foreign_cap_at_sequence_and_span_level():
    g_sum = torch.tensor([-6.0])
    logp = torch.full((1, 3), -1.0, requires_grad=True)       # Σℓ = −3: sequence ratio e^3, capped
    kw = dict(level="sequence", gen_logp_sum=g_sum, foreign=torch.tensor([True]))
    _, st = ftis_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3), foreign_cap=1.0, **kw)
    assert st["per_sample"]["is_weight"].item() == approx(1.0)
    _, st = ftis_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3), foreign_cap=0.5, **kw)
    assert st["per_sample"]["is_weight"].item() == approx(0.5)
    # span level: spans [0, 0, 1]; span 0's ratio e^(−2 − (−3)) = e, span 1's e^(−1 − (−0.5)) < 1
    span_ids, G = torch.tensor([[0, 0, 1]]), torch.tensor([[-3.0, -0.5]])
    _, st = ftis_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3), level="span",
                      span_ids=span_ids, gen_span_logp=G, foreign=torch.tensor([True]), foreign_cap=1.0)
    assert st["per_sample"]["is_weight"].item() == approx((1.0 + 1.0 + math.exp(-0.5)) / 3)


def test_foreign_cap_clips_vis_ratio_from_above():
    # vis: ρ = e^(ℓ − g); a foreign row's upper clip is min(1 + eps, cap) = 1, so a positive-advantage
    # token with ρ = e^0.5 > 1 gets no gradient and its term is −1·Â
    g = torch.tensor([[-1.5, -1.0]])
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, st = ftis_loss(logp, g, torch.tensor([1.0]), torch.ones(1, 2), method="vis",
                         foreign=torch.tensor([True]), foreign_cap=1.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == approx(-(1.0 + math.exp(-1.0)) / 2)
    assert_values(grad, [[0.0, -math.exp(-1.0) / 2]])
    assert st["clip_ratio/region_mean"] == approx(0.5)


@pytest.mark.parametrize("kw, match", [
    ({"foreign_cap": 0.0}, "foreign_cap"), ({"foreign_cap": float("inf")}, "foreign_cap"),
    ({"foreign_cap": "1"}, "foreign_cap"),
    ({"foreign": torch.tensor([1, 0]), "foreign_cap": 1.0}, "foreign must be a bool"),
    ({"foreign": torch.tensor([True]), "foreign_cap": 1.0}, "foreign must be a bool"),
])
def test_foreign_cap_bad_input(kw, match):
    with pytest.raises(ObjectiveError, match=match):
        tiny(**kw)
