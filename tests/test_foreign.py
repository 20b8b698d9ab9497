"""Samples from another model (batch.SampleRules, the learner's foreign cap): which peers are
foreign, the length rule, masked truncated completions, relative-success weights — on hand-made
groups and on real SmolLM2 rollouts re-tokenized for Gemma 3 and trained on by a real learner."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ftis_edge.learn.batch import (LocalTokenizer, OwnGroup, SampleRules, build_batch, success_rate,
                             success_weights)
from ftis_edge.generate.base import Completion
from ftis_edge.peers.intake import PeerGroup
from ftis_edge.rollout.samples import OWN, TrainSample
from ftis_edge.tasks.base import Prompt
from ftis_edge.rollout.wire import Rollout, WireCompletion

EOS = 2
ROLLOUTS = Path(__file__).parent / "data" / "real_rollouts.json"
ON = SampleRules(model_fp="ours", foreign_length_rule="refuse", foreign_success_floor=0.5,
                 mask_truncated_completions=True)


def ids(text: str) -> list[int]:
    return [ord(ch) % 250 + 3 for ch in text]


LOCAL = LocalTokenizer(prompt_ids=lambda p: [1] + ids(p.question), text_ids=ids, eos_token_id=EOS,
                       max_completion_length=4)


def prompt(i: int) -> Prompt:
    return Prompt(id=f"p{i}", question=f"{i} + {i}?", reference=str(2 * i))


def peer(node: str, rewards, texts, finish, *, same_tokenizer=True, model_fp="ours", i=3) -> PeerGroup:
    comps = [WireCompletion(token_ids=np.array(ids(t), dtype=np.int64),
                            logprobs=np.full(len(t), -0.5, dtype=np.float32), text=t, reward=r, finish_reason=f)
             for r, t, f in zip(rewards, texts, finish)]
    rollout = Rollout(rollout_id=f"{node}-{i}", node_id=node, swarm="s", task="arith", prompt_id=f"p{i}",
                      prompt_ids=None, group_id=f"{node}:1:{i}", group_index=0, group_size=len(comps), round=1,
                      completions=comps, model_fp=model_fp, tokenizer_fp="t", model_name="m", vocab_size=256,
                      temperature=1.0, top_k=0, top_p=1.0, adapter_version=0, sent_at=0.0)
    return PeerGroup(rollout=rollout, prompt=prompt(i), rewards=list(rewards), arrived_round=1,
                     same_tokenizer=same_tokenizer)


def own(rewards, finish) -> OwnGroup:
    comps = [Completion(token_ids=[10, 11], logprobs=[-0.5, -0.5], text="ab", finish_reason=f) for f in finish]
    return OwnGroup(prompt=prompt(0), prompt_ids=[1, 5], completions=comps, rewards=list(rewards),
                    breakdowns=[{}] * len(rewards), group_id="me:1:0")


def test_a_peer_is_foreign_by_tokenizer_or_by_base_weights():
    same = peer("a", [1.0, 0.0], ["ab", "cd"], ["stop", "stop"])
    other_weights = peer("b", [1.0, 0.0], ["ab", "cd"], ["stop", "stop"], model_fp="theirs")
    other_tok = peer("c", [1.0, 0.0], ["ab", "cd"], ["stop", "stop"], same_tokenizer=False, model_fp="ours")
    assert [ON.is_foreign(p) for p in (same, other_weights, other_tok)] == [False, True, True]
    # without our fingerprint, only the tokenizer tells
    assert [SampleRules().is_foreign(p) for p in (same, other_weights, other_tok)] == [False, False, True]
    b = build_batch([], [same, other_weights, other_tok], mode="vertical", scale="none", local=LOCAL,
                    rules=SampleRules(model_fp="ours"))
    assert [s.foreign for s in b.samples] == [False] * 2 + [True] * 4


def test_the_length_rule_refuses_foreign_samples_over_budget_or_cut_and_keeps_advantages():
    # budget 4 of our tokens: "abcd" fits (+EOS = 5 ids: over), "abc"+EOS fits, "ab" was cut by its generator
    p = peer("g", [1.0, 0.0, 1.0, 0.0], ["abcd", "abc", "ab", "a"], ["stop", "stop", "length", "stop"],
             same_tokenizer=False)
    plain = build_batch([], [p], mode="vertical", scale="none", local=LOCAL)
    b = build_batch([], [p], mode="vertical", scale="none", local=LOCAL, rules=ON)
    assert len(plain.samples) == 4 and plain.refused_length == 0
    assert [s.completion_ids for s in b.samples] == [ids("abc") + [EOS], ids("a") + [EOS]]
    assert b.refused_length == 2
    # the kept samples keep the advantages of the whole group (the grader's rewards)
    assert [s.advantage for s in b.samples] == [plain.samples[1].advantage, plain.samples[3].advantage]
    # same-model peers are never refused by it: their length is their own budget's business
    same = peer("s", [1.0, 0.0], ["abcdefgh", "ab"], ["length", "stop"])
    assert len(build_batch([], [same], mode="vertical", scale="none", local=LOCAL, rules=ON).samples) == 2
    # "truncate" keeps today's behaviour
    keep = SampleRules(model_fp="ours", foreign_length_rule="truncate")
    assert len(build_batch([], [p], mode="vertical", scale="none", local=LOCAL, rules=keep).samples) == 4


def test_truncated_completions_are_masked_not_dropped():
    g = own([1.0, 0.0, 1.0], ["stop", "length", "length"])
    p = peer("s", [1.0, 0.0], ["ab", "cd"], ["length", "stop"])
    b = build_batch([g], [p], mode="vertical", scale="std", local=LOCAL, rules=ON)
    assert [s.weight for s in b.samples] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert b.masked_truncated == 3 and len(b.samples) == 5
    off = build_batch([g], [p], mode="vertical", scale="std", local=LOCAL)
    assert [s.weight for s in off.samples] == [1.0] * 5 and off.masked_truncated == 0
    assert [s.advantage for s in b.samples] == [s.advantage for s in off.samples]
    # horizontal mode: the merged group's parts follow the same rules
    ph = peer("s", [1.0, 0.0], ["ab", "cd"], ["length", "stop"])
    ph.rollout.group_id = g.group_id
    h = build_batch([g], [ph], mode="horizontal", scale="std", local=LOCAL, rules=ON)
    assert [s.weight for s in h.samples] == [1.0, 0.0, 0.0, 0.0, 1.0] and h.masked_truncated == 3


def test_success_weights_are_relative_and_bounded():
    assert success_rate([]) == 0.5 and success_rate([1.0, 1.0]) == 0.75 and success_rate([2.0, -1.0]) == 0.5
    w = success_weights([1.0] * 8, {"worse": [0.0] * 8, "half": [1.0] * 4 + [0.0] * 4, "better": [1.0] * 8},
                        floor=0.25)
    assert w["better"] == 1.0                                  # never above 1
    assert w["half"] == pytest.approx((4 + 1) / 10 / (9 / 10))
    assert w["worse"] == 0.25                                  # (1/10) / (9/10) = 0.11 -> the floor
    assert success_weights([0.0] * 8, {"x": [0.0] * 8}, floor=0.5) == {"x": 1.0}
    # in a batch: only foreign peers are weighted, and only when the floor is below 1
    g = own([1.0, 1.0, 1.0, 0.0], ["stop"] * 4)
    worse = peer("gemma", [0.0, 0.0, 0.5, 0.0], ["a", "b", "c", "d"], ["stop"] * 4, same_tokenizer=False)
    twin = peer("twin", [0.0, 0.0, 0.5, 0.0], ["a", "b", "c", "d"], ["stop"] * 4)
    b = build_batch([g], [worse, twin], mode="vertical", scale="none", local=LOCAL, rules=ON)
    expect = max(0.5, success_rate(worse.rewards) / success_rate(g.rewards))
    assert {s.source: s.weight for s in b.samples if s.source != OWN} == {"gemma": pytest.approx(expect),
                                                                           "twin": 1.0}
    assert b.success_weight == pytest.approx(expect) and b.peer_weights == {"gemma": pytest.approx(expect)}
    with pytest.raises(ValueError, match="floor"):
        SampleRules(foreign_success_floor=1.5)
    with pytest.raises(ValueError, match="length_rule"):
        SampleRules(foreign_length_rule="cut")


# --------------------------------------------------------------------------- real rollouts, real models

def _real_groups():
    data = json.loads(ROLLOUTS.read_text())
    out = []
    for k, g in enumerate(data["groups"]):
        comps = [WireCompletion(token_ids=np.array(c["token_ids"], dtype=np.int64),
                                logprobs=np.array(c["logprobs"], dtype=np.float32), text=c["text"], reward=0.0,
                                finish_reason=c["finish_reason"], token_bytes=np.array(c["token_bytes"]))
                 for c in g["completions"]]
        rewards = [1.0 if j % 2 == 0 else 0.0 for j in range(len(comps))]   # any informative grading
        out.append((g, comps, rewards))
    return data, out


def _real_peer(node, g, comps, rewards, *, same_tokenizer, model_fp):
    rollout = Rollout(rollout_id=f"{node}-{g['prompt_id']}", node_id=node, swarm="s", task=g["task"],
                      prompt_id=g["prompt_id"], prompt_ids=None, group_id=f"{node}:1:{g['prompt_id']}",
                      group_index=0, group_size=len(comps), round=1, completions=comps, model_fp=model_fp,
                      tokenizer_fp="t", model_name="m", vocab_size=49152, temperature=1.0, top_k=0, top_p=1.0,
                      adapter_version=0, sent_at=0.0)
    return PeerGroup(rollout=rollout, prompt=Prompt(id=g["prompt_id"], question="q", reference="0"),
                     rewards=rewards, arrived_round=1, same_tokenizer=same_tokenizer)


@pytest.mark.model
def test_real_smollm2_text_for_gemma_is_refused_by_its_length_in_gemma_tokens():
    from ftis_edge.models.resolve import resolve_model
    gemma = resolve_model("gemma3-270m")
    tok = gemma.tokenizer()
    data, groups = _real_groups()
    budget = 64
    prompts = {g["prompt_id"]: g["prompt_ids"] for g, _, _ in groups}
    local = LocalTokenizer.of_bundle(gemma, lambda p: [2] + list(prompts[p.id][:8]), max_completion_length=budget,
                                     token_bytes=None)     # sequence level: the length rule is what is tested
    peers = [_real_peer("smol", g, c, r, same_tokenizer=False, model_fp="smol") for g, c, r in groups]
    rules = SampleRules(model_fp=gemma.fingerprint, foreign_length_rule="refuse")
    b = build_batch([], peers, mode="vertical", scale="std", local=local, rules=rules)
    # independently: Gemma's own count of each text's tokens (+ its EOS when the peer stopped)
    expect_kept = []
    for _, comps, _ in groups:
        for c in comps:
            n = len(tok(c.text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
            n += c.finish_reason == "stop"
            if c.finish_reason == "stop" and n <= budget:
                expect_kept.append(n)
    total = sum(len(c) for _, c, _ in groups)
    assert 0 < len(expect_kept) < total                       # the fixture has both kinds
    assert [len(s.completion_ids) for s in b.samples] == expect_kept
    assert b.refused_length == total - len(expect_kept)
    assert all(s.foreign and s.level == "sequence" for s in b.samples)


@pytest.mark.model
def test_real_learner_imitating_another_models_text_keeps_its_weight_at_the_cap():
    """A real SmolLM2 learner trains on real SmolLM2 rollouts sent by a peer with other base weights
    (same tokenizer: token level). After steps on the positive samples it finds them likelier than
    their generator did: the plain weight rises above 1 (toward C), the foreign cap holds it at 1."""
    from ftis_edge.learn.learner import Learner
    from ftis_edge.models.resolve import resolve_model
    smol = resolve_model("smollm2-135m")
    _, groups = _real_groups()
    g, comps, rewards = groups[0]
    pos = [TrainSample(list(g["prompt_ids"]), [int(t) for t in c.token_ids][:24],
                       [float(x) for x in c.logprobs][:24], None, 1.0, source="peer", foreign=True)
           for c, r in zip(comps, rewards) if r > 0][:3]
    learner = Learner(smol.hf_dir(), trainable="lora", lr=3e-3, seed=0, device="cpu")
    for _ in range(2):                        # imitate: raise the likelihood of these texts (no cap)
        learner.step(pos, method="f-tis", C=2.0)
    with torch.no_grad():
        plain = learner.compute_gradients(pos, method="f-tis", C=2.0)
        capped = learner.compute_gradients(pos, method="f-tis", C=2.0, foreign_cap=1.0)
    learner.optimizer.zero_grad(set_to_none=True)
    w_plain, w_capped = plain["per_sample"]["is_weight"], capped["per_sample"]["is_weight"]
    assert float(w_plain.mean()) > 1.05                       # imitation pushed the weight up
    assert float(w_capped.max()) <= 1.0 + 1e-6
    assert capped["is/foreign_capped"] == len(pos) and capped["samples/foreign"] == len(pos)
    assert plain["is/foreign_capped"] == 0
    # a same-model sample (foreign=False) keeps C in the same call
    mixed = [pos[0], TrainSample(**{**pos[1].__dict__, "foreign": False})]
    st = learner.compute_gradients(mixed, method="f-tis", C=2.0, foreign_cap=1.0)
    learner.optimizer.zero_grad(set_to_none=True)
    assert float(st["per_sample"]["is_weight"][0]) <= 1.0 + 1e-6
    assert float(st["per_sample"]["is_weight"][1]) == pytest.approx(float(w_plain[1]), rel=1e-4)
