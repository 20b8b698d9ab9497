"""Kin, not crowds on the real SmolLM2 learner and the committed real rollouts: measuring a peer
leaves the step exactly as it is without it, and the step weight worth and the saving count is
what the learner gave each sample (its IS weight, the bound on claimed-foreign text, the judge)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ftis_edge.learn.batch import peer_usage
from ftis_edge.peers.plausibility import FOREIGN_STEP_WEIGHT, PlausibilityConfig
from ftis_edge.rollout.samples import OWN, TrainSample

pytestmark = pytest.mark.model
ROLLOUTS = Path(__file__).parent / "data" / "real_rollouts.json"
CUT = 24                                         # tokens per completion: a CPU step in seconds


def _samples(group: int, source: str, level: str = "token") -> list[TrainSample]:
    g = json.loads(ROLLOUTS.read_text())["groups"][group]
    out = []
    for j, c in enumerate(g["completions"][:4]):
        ids, lp = [int(t) for t in c["token_ids"]][:CUT], [float(x) for x in c["logprobs"]][:CUT]
        adv = 1.0 if j % 2 == 0 else -1.0
        if level == "token":
            out.append(TrainSample(list(g["prompt_ids"]), ids, lp, None, adv, source=source))
        else:                                    # claimed another tokenizer: one weight per sequence
            out.append(TrainSample(list(g["prompt_ids"]), ids, None, sum(lp), adv, sequence_level=True,
                                   source=source, foreign=True))
    return out


def _learner(smol):
    from ftis_edge.learn.learner import Learner
    return Learner(smol.hf_dir(), trainable="lora", lr=1e-3, seed=0, device="cpu")


def _weights(learner) -> dict:
    return {k: v.detach().clone() for k, v in learner.trainable_state().items()}


def test_measuring_a_peer_before_the_step_leaves_the_step_bit_identical(smol):
    """Round.measure: a pass over the peers' samples on the weights the step starts from, then the
    step on the own batch. The weights after it equal those of the step alone, bit for bit."""
    own, peer = _samples(0, OWN), _samples(1, "newcomer")
    alone, measured = _learner(smol), _learner(smol)
    alone.step(own, method="f-tis", C=2.0)
    st = measured.compute_gradients(peer, None, method="f-tis", C=2.0)
    measured.step(own, method="f-tis", C=2.0)
    a, m = _weights(alone), _weights(measured)
    assert a.keys() == m.keys() and all(torch.equal(a[k], m[k]) for k in a)
    assert alone.version == measured.version == 1
    uses = peer_usage(peer, st["per_sample"], None)
    w = st["per_sample"]["is_weight"]
    assert [u.step_weight for u in uses] == pytest.approx([min(1.0, float(x)) for x in w])
    assert all(0.0 < u.step_weight <= 1.0 for u in uses)      # its own model's text: near-full


def test_the_step_weight_is_what_the_learner_gave_each_peer_sample(smol):
    """One step with own, same-tokenizer and claimed-foreign samples under the plausibility defence:
    a token-level peer sample weighs its truncated IS weight (0 if judged implausible or dropped),
    a claimed-foreign one that times the learner's bound (1/8 a step shared by the 4)."""
    own, twin, foreign = _samples(0, OWN), _samples(1, "twin"), _samples(2, "gemma", level="sequence")
    learner = _learner(smol)
    batch = own + twin + foreign
    plausible = PlausibilityConfig()
    st = learner.step(batch, plausible=plausible, method="f-tis", C=2.0)
    ps = st["per_sample"]
    uses = {u.index: u for u in peer_usage(batch, ps, plausible)}
    assert sorted(uses) == list(range(len(own), len(batch)))
    for i, u in uses.items():
        gone = bool(ps["dropped"][i]) or bool(ps["implausible"][i])
        base = min(1.0, float(ps["is_weight"][i]))
        bound = 1.0 if i < len(own) + len(twin) else FOREIGN_STEP_WEIGHT / len(foreign)
        assert u.step_weight == pytest.approx(0.0 if gone else base * bound), i
    assert max(uses[i].step_weight for i in uses if i >= len(own) + len(twin)) <= FOREIGN_STEP_WEIGHT / 4
