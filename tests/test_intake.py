"""Peer rollouts on the way in, with the real arith task and grader (no model needed)."""
from __future__ import annotations

import numpy as np
import pytest

from ftis_edge.intake import Intake, PeerBook
from ftis_edge.swarm import Received
from ftis_edge.tasks import get_task
from ftis_edge.wire import Rollout, WireCompletion, WireError, decode, encode

pytestmark = pytest.mark.timeout(60)
VOCAB = 49152


@pytest.fixture(scope="module")
def task():
    return get_task("arith")


def rollout(task, node="peer", texts=None, claimed=1.0, prompt=None, tokenizer_fp="tok", **kw):
    prompt = prompt or next(task.prompts(seed=3))
    texts = texts or ["<answer>999999</answer>"] * 4
    comps = [WireCompletion(token_ids=np.arange(5) + i, logprobs=-np.full(5, 0.5, np.float32), text=t,
                            reward=claimed, finish_reason="stop") for i, t in enumerate(texts)]
    r = Rollout(node_id=node, swarm="s", task="arith", prompt_id=prompt.id, completions=comps,
                vocab_size=VOCAB, model_fp="m", tokenizer_fp=tokenizer_fp, group_size=len(comps), **kw)
    return decode(encode(r)), prompt          # through the real wire, as a peer's would arrive


def intake_for(task, **kw):
    return Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp="tok", vocab_size=VOCAB,
                  book=PeerBook(quarantine_after=3), **kw)


def test_a_forged_reward_is_replaced_by_the_local_grade(task):
    r, prompt = rollout(task, claimed=1.0)
    right = f"<answer>{prompt.reference}</answer>"
    r.completions[0].text = right          # one honest completion among forged ones
    intake = intake_for(task)
    intake.receive([Received(rollout=r, sender="peer", nbytes=100)], current_round=1)
    [group] = intake.take(1, limit=8)
    assert group.rewards == [1.0, 0.0, 0.0, 0.0]
    peer = intake.book.snapshot()["peer"]
    assert peer["accepted"] == 1 and peer["reward_mismatches"] == 3 and group.same_tokenizer


def test_bad_rollouts_are_counted_by_reason_and_the_peer_is_quarantined(task):
    intake = intake_for(task)
    bad = [Received(rollout=None, sender="mallory", nbytes=10, error=WireError("bad_logprob", "nan"))] * 2
    other_swarm, _ = rollout(task, node="mallory")
    other_swarm.swarm = "elsewhere"
    intake.receive(bad + [Received(rollout=other_swarm, sender="mallory", nbytes=10)], current_round=1)
    book = intake.book.snapshot()["mallory"]
    assert book["rejected_by_reason"] == {"bad_logprob": 2, "wrong_swarm": 1}
    assert book["quarantined"] is True
    good, _ = rollout(task, node="mallory")
    intake.receive([Received(rollout=good, sender="mallory", nbytes=10)], current_round=2)
    assert intake.take(2, limit=8) == []       # quarantined: even valid rollouts are refused
    assert intake.book.snapshot()["mallory"]["rejected_by_reason"]["quarantined"] == 1


def test_unknown_prompt_ids_and_own_echoes(task):
    intake = intake_for(task)
    r, _ = rollout(task)
    r.prompt_id = "arith/not-an-id"
    mine, _ = rollout(task, node="me")
    intake.receive([Received(rollout=r, sender="peer", nbytes=1), Received(rollout=mine, sender="me", nbytes=1)], 1)
    assert intake.book.snapshot()["peer"]["rejected_by_reason"] == {"unknown_prompt": 1}
    assert "me" not in intake.book.snapshot()


def test_stale_groups_are_dropped_and_the_newest_are_taken_first(task):
    intake = intake_for(task, max_staleness=1)
    old, _ = rollout(task)
    new, _ = rollout(task)
    intake.receive([Received(rollout=old, sender="peer", nbytes=1)], current_round=1)
    intake.receive([Received(rollout=new, sender="peer", nbytes=1)], current_round=3)
    taken = intake.take(3, limit=8)
    assert [g.rollout.rollout_id for g in taken] == [new.rollout_id]
    assert intake.pop_round_counts()["stale"] == 1


def test_a_hostile_answer_cannot_stall_rescoring(task):
    import time
    texts = ["<answer>9^{9^{9^{9^{9}}}}</answer>"] * 4
    r, _ = rollout(task, texts=texts)
    intake = intake_for(task, rescore_budget_s=1.0)
    t0 = time.time()
    intake.receive([Received(rollout=r, sender="peer", nbytes=1)], current_round=1)
    assert time.time() - t0 < 5.0
    groups = intake.take(1, limit=8)
    assert all(v == 0.0 for g in groups for v in g.rewards)


def test_other_tokenizer_is_marked_for_the_sequence_level_path(task):
    r, _ = rollout(task, tokenizer_fp="gemma-tok")
    intake = intake_for(task)
    intake.receive([Received(rollout=r, sender="peer", nbytes=1)], current_round=1)
    [g] = intake.take(1, limit=8)
    assert g.same_tokenizer is False
