"""The learner-side poisoning filter's pure parts (plausibility.py) and the objective's sample weight."""
import math

import pytest
import torch

from ftis_edge.objective import ObjectiveError, ftis_loss
from ftis_edge.plausibility import (PlausibilityConfig, calibrate, excess_logp, plausible_weight,
                                    worst_window)


def test_worst_window_is_the_lowest_window_mean_inside_each_row():
    x = torch.tensor([[0.0, 0.0, -3.0, -3.0, 0.0, 99.0],     # 5 tokens + padding
                      [-1.0, -2.0, 0.0, 0.0, 0.0, 0.0]])     # 2 tokens: shorter than the window
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    out = worst_window(x, mask, 3)
    assert out[0].item() == pytest.approx(-2.0)             # (-3 - 3 + 0) / 3; padding never read
    assert out[1].item() == pytest.approx(-1.5)             # the row's mean
    empty = worst_window(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.bool), 3)
    assert math.isinf(empty[0].item()) and empty[0].item() > 0


def test_excess_logp_adds_the_entropy_and_zeroes_padding():
    logp = torch.tensor([[-2.0, float("nan")]])
    ent = torch.tensor([[1.5, 7.0]])
    x = excess_logp(logp, ent, torch.tensor([[True, False]]))
    assert x.tolist() == [[-0.5, 0.0]]


def test_calibrate_is_a_low_quantile_of_own_scores_minus_the_margin_else_the_last_one():
    cfg = PlausibilityConfig(quantile=0.0, margin=0.5, min_own=3, default_threshold=-9.0)
    assert calibrate(torch.tensor([-1.0, -0.2, -0.4]), cfg, None) == pytest.approx(-1.5)
    assert calibrate(torch.tensor([-1.0, float("inf")]), cfg, -2.0) == -2.0   # too few: the last one
    assert calibrate(torch.tensor([]), cfg, None) == -9.0                       # none ever: the default


def test_only_peer_samples_below_the_threshold_lose_their_weight():
    scores = torch.tensor([-5.0, -5.0, -0.1])
    is_peer = torch.tensor([False, True, True])
    assert plausible_weight(scores, is_peer, -1.0).tolist() == [1.0, 0.0, 1.0]


def _batch():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    gen = torch.tensor([[-1.5, -1.0], [-0.1, -0.2]])
    return logp, gen, torch.tensor([1.5, 0.7]), torch.ones(2, 2, dtype=torch.bool)


def test_sample_weight_zero_removes_a_positive_advantage_sample_from_loss_and_gradient():
    logp, gen, adv, mask = _batch()
    loss, _ = ftis_loss(logp, gen, adv, mask, sample_weight=torch.tensor([1.0, 0.0]))
    loss.backward()
    assert logp.grad[1].abs().sum() == 0 and logp.grad[0].abs().sum() > 0
    ref, _ = ftis_loss(logp[:1].detach(), gen[:1], adv[:1], mask[:1], num_samples=2)
    assert loss.item() == pytest.approx(ref.item())           # the divisor N stays the batch's
    plain, _ = ftis_loss(logp.detach(), gen, adv, mask)
    ones, _ = ftis_loss(logp.detach(), gen, adv, mask, sample_weight=torch.ones(2))
    assert plain.item() == ones.item()


@pytest.mark.parametrize("w", [[0.5], [1.0, 2.0], [float("nan"), 1.0], [-0.1, 1.0]])
def test_bad_sample_weight_is_refused(w):
    logp, gen, adv, mask = _batch()
    with pytest.raises(ObjectiveError, match="sample_weight"):
        ftis_loss(logp, gen, adv, mask, sample_weight=torch.tensor(w))
