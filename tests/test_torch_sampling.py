"""The torch sampler (HF backend, on the model's device): the numpy sampler's distribution and log-probs."""
import numpy as np
import pytest
import torch

from ftis_edge.generate.base import SamplerSettings
from ftis_edge.generate.sampling import processed_logprobs, token_logprobs
from ftis_edge.generate.torch_sampling import device_generator, processed_logprobs_torch, sample_tokens_torch

SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 50, 1.0), (1.0, 0, 0.9), (0.8, 40, 0.95), (1.3, 1, 1.0),
            (1.0, 0, 0.01)]


# float32 log-softmax over a 49k vocabulary: the normaliser's rounding error grows like sqrt(V)·eps ≈ 1.3e-5, and
# the order of that sum follows the CPU's vector width (1.6e-5 seen on an AMD EPYC, < 1e-5 on a Xeon). A wrong
# temperature, cut or normaliser is off by 1e-2 or more, so 1e-4 still catches every real mistake.
LOGPROB_TOL = 1e-4


def _logits(n=4, vocab=49152, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g) * 4.0


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_processed_logprobs_equal_the_numpy_samplers(temperature, top_k, top_p):
    logits = _logits()
    got = processed_logprobs_torch(logits, temperature, top_k, top_p)
    ref = processed_logprobs(logits.numpy(), temperature, top_k, top_p)
    kept = np.isfinite(ref)
    assert np.array_equal(torch.isfinite(got).numpy(), kept)       # the same tokens truncated
    assert np.abs(got.numpy()[kept] - ref[kept]).max() <= LOGPROB_TOL


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sampled_log_probs_equal_the_recomputed_ones(temperature, top_k, top_p):
    logits = _logits(n=8, seed=1)
    s = SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, lp = sample_tokens_torch(logits, s, device_generator(logits.device, 3))
    assert tokens.dtype == torch.long and tokens.device == logits.device
    ref = np.array([token_logprobs(logits[i:i + 1].numpy(), [int(tokens[i])], temperature, top_k, top_p)[0]
                    for i in range(len(tokens))])
    assert np.isfinite(ref).all()                # never a truncated token
    assert np.abs(lp.numpy() - ref).max() <= LOGPROB_TOL


def test_greedy_is_the_argmax_with_log_prob_zero():
    logits = _logits(n=3)
    tokens, lp = sample_tokens_torch(logits, SamplerSettings(temperature=0.0))
    assert torch.equal(tokens, logits.argmax(1)) and torch.equal(lp, torch.zeros(3))


def _frequencies(logits, s, draws=20000, seed=0):
    rows = logits.expand(draws, -1)
    tokens, _ = sample_tokens_torch(rows, s, device_generator(torch.device("cpu"), seed))
    return torch.bincount(tokens, minlength=logits.shape[1]).double() / draws


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 3, 1.0), (1.0, 0, 0.7),
                                                     (2.0, 4, 0.8)])
def test_sampling_frequencies_follow_the_processed_distribution(temperature, top_k, top_p):
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, -1.0, 0.8, 1.2]])
    s = SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = np.exp(processed_logprobs(logits.numpy(), temperature, top_k, top_p))[0]
    freq = _frequencies(logits, s).numpy()
    assert np.all(freq[probs == 0] == 0)         # truncated tokens are never drawn
    # 20000 draws: a standard error of at most 0.0035 per token
    assert np.abs(freq - probs).max() < 0.015, (freq, probs)


def test_the_same_seed_gives_the_same_tokens():
    logits = _logits(n=8, vocab=1000)
    s = SamplerSettings(temperature=1.0, top_p=0.9)
    a, _ = sample_tokens_torch(logits, s, device_generator(logits.device, 7))
    b, _ = sample_tokens_torch(logits, s, device_generator(logits.device, 7))
    assert torch.equal(a, b)


def test_bf16_logits_are_sampled_in_float32():
    logits = _logits(n=2, vocab=5000).to(torch.bfloat16)
    lp = processed_logprobs_torch(logits, 1.0, 0, 0.9)
    ref = processed_logprobs(logits.float().numpy(), 1.0, 0, 0.9)
    assert lp.dtype == torch.float32
    kept = np.isfinite(ref)
    assert np.abs(lp.numpy()[kept] - ref[kept]).max() <= LOGPROB_TOL
