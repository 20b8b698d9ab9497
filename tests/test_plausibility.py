"""The learner-side poisoning filter's pure parts (plausibility.py) and the objective's sample weight."""
import math

import pytest
import torch

from ftis_edge.learn.objective import ObjectiveError, ftis_loss
from ftis_edge.peers.plausibility import (PlausibilityConfig, calibrate, excess_logp, plausible_weight,
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
    cfg = PlausibilityConfig(quantile=0.0, margin=0.5, min_own=3, default_threshold=-9.0, ceiling=0.0)
    assert calibrate(torch.tensor([-1.0, -0.2, -0.4]), cfg, None) == pytest.approx(-1.5)
    strict = PlausibilityConfig(quantile=0.0, margin=0.5, min_own=3, ceiling=-2.5)
    assert calibrate(torch.tensor([-1.0, -0.2, -0.4]), strict, None) == -2.5   # never stricter than the ceiling
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


def test_a_token_weight_removes_only_that_tokens_gradient_and_keeps_the_divisors():
    logp, gen, adv, mask = _batch()
    w = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = ftis_loss(logp, gen, adv, mask, sample_weight=w)
    loss.backward()
    assert logp.grad[1, 1] == 0 and logp.grad[1, 0] != 0 and bool((logp.grad[0] != 0).all())
    plain = logp.detach().clone().requires_grad_(True)
    ref, _ = ftis_loss(plain, gen, adv, mask)
    ref.backward()
    assert torch.allclose(logp.grad[:, 0], plain.grad[:, 0])   # same per-token scale: n_i unchanged
    assert torch.allclose(logp.grad[0], plain.grad[0])


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (2, 2, 1)])
def test_a_token_weight_of_the_wrong_shape_is_refused(shape):
    logp, gen, adv, mask = _batch()
    with pytest.raises(ObjectiveError, match="sample_weight"):
        ftis_loss(logp, gen, adv, mask, sample_weight=torch.ones(shape))


@pytest.mark.parametrize("method", ["f-tis", "f-vis", "nois"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_token_of_weight_zero_gets_no_gradient_at_any_level(method, level):
    """A sequence-level ratio sums every token's log-prob: masking the term alone would still
    push the masked token up; its log-prob must be cut from the graph."""
    logp, _, adv, mask = _batch()
    gen = logp.detach().clone()                 # ratio 1: no clipping hides a gradient
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, _ = ftis_loss(logp, gen, adv, mask, sample_weight=w, method=method, level=level)
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[1, 0] == 0
    assert logp.grad[0, 0] != 0 and logp.grad[1, 1] != 0


def test_repeat_memory_masks_an_unlikely_ngram_the_second_time_only():
    from ftis_edge.peers.plausibility import RepeatMemory
    mem = RepeatMemory(capacity=100)
    phrase, lp = [7, 8, 9, 10], [-5.0, -4.0, -4.0, -3.0]          # sum -16 < -12: unlikely
    first = mem.judge([1, 2] + phrase + [3], [-0.1, -0.1] + lp + [-0.1], n=4, threshold=-12.0, prompt_ids=[50])
    assert not any(first)                                           # the first exposure trains
    again = mem.judge([5] + phrase, [-0.2] + [x + 3 for x in lp], n=4, threshold=-12.0, prompt_ids=[50])
    assert again == [False, True, True, True, True]   # masked under the same question too, though likelier now
    other = mem.judge([6] + phrase, [-0.1] * 5, n=4, threshold=-12.0, prompt_ids=[60])
    assert other == [False, True, True, True, True]
    likely = mem.judge([1, 2, 3, 4, 1, 2, 3, 4], [-0.5] * 8, n=4, threshold=-12.0)
    assert not any(likely) and not any(mem.judge([1, 2, 3, 4], [-0.5] * 4, n=4, threshold=-12.0))


def test_repeat_memory_is_bounded_and_forgets_the_oldest():
    from ftis_edge.peers.plausibility import RepeatMemory
    mem = RepeatMemory(capacity=3)
    for k in range(5):
        mem.judge([100 + k, 1, 2, 3], [-4.0] * 4, n=4, threshold=-12.0)
    assert len(mem) == 3
    assert not any(mem.judge([100, 1, 2, 3], [-4.0] * 4, n=4, threshold=-12.0))   # forgotten
    assert all(mem.judge([104, 1, 2, 3], [-4.0] * 4, n=4, threshold=-12.0))


def test_short_gaps_between_masked_tokens_are_masked_too():
    from ftis_edge.peers.plausibility import close_gaps
    m = [True, False, False, True, False, False, False, False, False, True]
    assert close_gaps(m, 4) == [True] * 4 + [False] * 5 + [True]
    assert close_gaps([False, True, False], 4) == [False, True, False]      # no masked token after


def test_ngrams_the_answer_copies_from_its_prompt_are_never_masked():
    from ftis_edge.peers.plausibility import RepeatMemory
    mem = RepeatMemory()
    quoted, lp = [7, 8, 9, 10], [-3.5] * 4                  # -14 in all; with the token before: -10.6
    for _ in range(3):
        assert not any(mem.judge([1] + quoted, [-0.1] + lp, n=4, threshold=-12.0, prompt_ids=[3] + quoted + [4]))
    assert len(mem) == 0


# --- another tokenizer's text trains at a bounded weight (issue 51 item 3) ------------------

def test_claimed_foreign_samples_share_a_bounded_weight_however_many_ids_send_them():
    from ftis_edge.peers.plausibility import PlausibilityConfig, foreign_factors
    cfg = PlausibilityConfig(foreign_sample_weight=0.125, foreign_step_weight=0.25)
    assert foreign_factors([False, True], cfg) == [1.0, 0.125]              # one sample: its own cap
    assert foreign_factors([False] + [True] * 4, cfg) == [1.0] + [0.0625] * 4   # four share the step's
    assert foreign_factors([True, True], PlausibilityConfig(bound_foreign=False)) == [1.0, 1.0]
    with pytest.raises(ValueError):
        PlausibilityConfig(foreign_sample_weight=1.5)


def test_the_learner_bounds_only_peer_samples_that_claim_another_tokenizer():
    from ftis_edge.learn.learner import _bound_foreign
    from ftis_edge.peers.plausibility import PlausibilityConfig
    from ftis_edge.rollout.samples import TrainSample
    own = TrainSample([1], [2], [-1.0], None, 1.0)
    same = TrainSample([1], [2], [-1.0], None, 1.0, source="bob")
    other = TrainSample([1], [2], None, -1.0, 1.0, sequence_level=True, source="eve", foreign=True, weight=0.5)
    out = _bound_foreign([own, same, other], PlausibilityConfig())
    assert [s.weight for s in out] == [1.0, 1.0, 0.5 * 0.0625] and out[0] is own and other.weight == 0.5
    # by default the bound is all that holds an attacker claiming another tokenizer (no threshold,
    # no memories on those samples): two of them share the step's 1/8
    two = _bound_foreign([own, same, other, other], PlausibilityConfig())
    assert [s.weight for s in two] == [1.0, 1.0, 0.5 * 0.0625, 0.5 * 0.0625]
    first = _bound_foreign([own, other, other, other], PlausibilityConfig(foreign_sample_weight=0.125,
                                                                          foreign_step_weight=0.25))
    assert [s.weight for s in first] == [1.0] + [0.5 * 0.25 / 3] * 3
