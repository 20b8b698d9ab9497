"""head_logprob: the LM head's per-row log-prob and entropy, and their gradients, equal a plain
full-vocabulary log_softmax (frozen head: gradient computed in the forward; trained head and bias:
recomputed in the backward; with and without a softcap)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ftis_edge.learn.head_logprob import head_logprob


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("train_head", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_head_logprob_matches_a_full_log_softmax(softcap, train_head, with_bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=train_head)
    b = torch.randn(50, generator=g, dtype=torch.float64, requires_grad=train_head) if with_bias else None
    t = torch.randint(0, 50, (37,), generator=g)
    upstream = torch.randn(37, generator=g, dtype=torch.float64)

    z = F.linear(h, w, b)
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    ref_all = F.log_softmax(z, -1)
    ref, ref_ent = ref_all.gather(1, t[:, None])[:, 0], -(ref_all.exp() * ref_all).sum(-1)
    lp, ent = head_logprob(h, w, b, t, softcap, entropy=True)
    torch.testing.assert_close(lp.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-4, rtol=0)
    assert not ent.requires_grad

    trained = [x for x in (h, w, b) if x is not None and x.requires_grad]
    got = torch.autograd.grad((lp * upstream).sum(), trained)
    want = torch.autograd.grad((ref * upstream).sum(), trained)
    for a, r in zip(got, want):
        assert a.dtype == r.dtype
        torch.testing.assert_close(a, r, atol=1e-4, rtol=0)
    torch.testing.assert_close(head_logprob(h, w, b, t, softcap), lp)


def test_head_logprob_without_grad_keeps_nothing_for_a_backward():
    h, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, 3, 4])
    with torch.no_grad():
        lp = head_logprob(h, w, None, t)
    assert not lp.requires_grad and lp.shape == (4,) and bool((lp <= 0).all())
