"""Grading cannot be sliced away by many ids (issue 51 item 6): hundreds of Sybil ids, one cheap
rollout each a round, used to shrink every sender's slice of the re-grading budget below what
grading an honest group costs, so that nobody's group, the honest peer's included, got graded.
Real Intake, real math-verify grader worker, real SmolLM2 tokenizer; the numbers for every
arrival order come from ``benchmarks.attacks.grading_sybils``."""
from __future__ import annotations

import pytest

from ftis_edge.peers.grading import FRONT, KNOWN, NEWCOMER, OVERRAN, SHARE, SLOW, Standing, grading_class, grading_key
from ftis_edge.peers.swarm import Received
from ftis_edge.tasks import warm_up
from testkit.peers import intake_for, rollout


def test_the_classes_put_a_share_of_newcomers_then_useful_peers_in_front():
    assert grading_class(Standing(None), 0.5, True) == SHARE              # within the newcomers' share
    assert grading_class(Standing(0.01, useful=True), 0.5, True) == FRONT
    assert grading_class(Standing(None), 0.5, False) == NEWCOMER         # share spent
    assert grading_class(Standing(0.01, useful=False), 0.5, True) == KNOWN
    assert grading_class(Standing(0.3, useful=True), 0.5, True) == SLOW
    assert grading_class(Standing(0.01, useful=True, slow=True), 0.5, True) == OVERRAN
    assert SHARE < FRONT < NEWCOMER < KNOWN < SLOW < OVERRAN


def test_within_a_class_first_turns_then_short_answers_then_the_ring():
    near = grading_key("a", FRONT, 0, 7, 5)
    far = grading_key("b", FRONT, 0, 1, 9)
    longer = grading_key("c", FRONT, 0, 8, 0)
    second_turn = grading_key("d", FRONT, 1, 0, 0)
    assert sorted([second_turn, longer, far, near]) == [near, far, longer, second_turn]


@pytest.mark.timeout(300)
def test_hundreds_of_ids_with_cheap_answers_cannot_keep_a_known_peer_ungraded(smol, task):
    prompt = next(task.prompts(seed=3))
    right, wrong = f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"
    cheap = rollout(smol, task, node="s", prompt=prompt, texts=[wrong] * 4)[0]
    honest = rollout(smol, task, node="alice", prompt=prompt, texts=[right, wrong] * 2)[0]

    def copy(r, node):
        return type(r)(**{**r.__dict__, "node_id": node})

    intake = intake_for(smol, task, rescore_budget_s=2.0)
    warm_up()
    intake.receive([Received(rollout=copy(honest, "alice"), sender="alice", nbytes=100)], current_round=1)
    assert len(intake.take(1, limit=8)) == 1
    for rnd in (2, 3):     # 400 ids: an equal split of 2 s is 5 ms each, less than one group costs
        warm_up()
        items = [Received(rollout=copy(cheap, f"sybil-{i}"), sender=f"sybil-{i}", nbytes=100) for i in range(400)]
        items += [Received(rollout=copy(honest, "alice"), sender="alice", nbytes=100) for _ in range(2)]
        intake.receive(items, current_round=rnd)                   # the Sybils arrive first
        mine = [g for g in intake.take(rnd, limit=1024) if g.rollout.node_id == "alice"]
        assert len(mine) == 2 and all(g.rewards == [1.0, 0.0, 1.0, 0.0] for g in mine), f"round {rnd}"
    assert intake.book.snapshot()["alice"]["rejected"] == 0
