"""The same samples scored by both engines: per-token log-probs under the PyTorch learner and under
a llama.cpp generator, and how far apart two sets of them are (nats per token)."""
from __future__ import annotations

import numpy as np
import torch


def hf_scores(learner, samples) -> list[np.ndarray]:
    """The learner's log-prob of each completion token, one array per sample."""
    with torch.no_grad():
        logp, mask = learner.logprobs(samples)
    return [logp[b][mask[b]].double().numpy() for b in range(len(samples))]


def cpp_scores(gen, samples) -> list[np.ndarray]:
    """llama.cpp's log-prob of each completion token (the generator's current weights)."""
    return [np.asarray(gen.score(s.prompt_ids, [s.completion_ids])[0], dtype=np.float64) for s in samples]


def mean_abs(a, b) -> float:
    """Mean |Δ log p| over every token of two score lists."""
    return float(np.abs(np.concatenate(a) - np.concatenate(b)).mean())
