"""Grading cannot be denied by many ids: 40 fake ids, one rollout each a round, whose answers
grade just under the time limit (real math-verify on a 26-fold factorial of x, ``x!!…!``, 0.1-0.3 s;
a symbolic answer with no operation on numbers, so the computation rule does not refuse it unread:
``\\binom{x}{60}``, used before, is refused unread since binomials count as computations),
ahead of an honest peer. Every honest group is graded every round, the honest peer is never
charged a ``grader_timeout``, and the fakes end up graded after it (their cost is known). That the
round keeps to its budget is tests/test_grading.py's, on a made-up clock."""
from __future__ import annotations

import pytest

from ftis_edge.peers.grading import grading_tier
from ftis_edge.peers.swarm import Received
from ftis_edge.tasks import warm_up
from testkit.peers import intake_for, rollout

SLOW = "<answer>x" + "!" * 26 + "</answer>"


def test_the_tiers_put_known_fast_senders_first_and_known_slow_ones_last():
    assert grading_tier(0.01, 0.5, False) == 0 and grading_tier(None, 0.5, False) == 1
    assert grading_tier(0.3, 0.5, False) == 2 and grading_tier(0.01, 0.5, True) == 3


def test_the_slow_payload_is_graded_not_refused_unread():
    """Guards this file against going vacuous: a payload the prefilter refuses costs nothing."""
    from ftis_edge.tasks.grader import score
    warm_up()
    _, info = score(SLOW, "18")
    assert not str(info.get("reason", "")).startswith("refused"), info


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.timeout(300)
def test_forty_ids_just_under_the_time_limit_cannot_keep_an_honest_group_ungraded(smol, task):
    prompt = next(task.prompts(seed=3))
    intake = intake_for(smol, task, rescore_budget_s=5.0)
    for rnd in (1, 2, 3):
        warm_up()      # between rounds a node generates and trains: killed grader workers restart
        fakes = [Received(rollout=rollout(smol, task, node=f"fake-{i}", prompt=prompt, texts=[SLOW] * 4)[0],
                          sender=f"fake-{i}", nbytes=100) for i in range(40)]
        honest = [Received(rollout=rollout(smol, task, node="alice", prompt=prompt,
                                           texts=[f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"] * 2)[0],
                           sender="alice", nbytes=100) for _ in range(2)]
        intake.receive(fakes + honest, current_round=rnd)         # the fakes arrive first
        groups = [g for g in intake.take(rnd, limit=256) if g.rollout.node_id == "alice"]
        assert len(groups) == 2 and all(g.rewards == [1.0, 0.0, 1.0, 0.0] for g in groups), f"round {rnd}"
    book = intake.book.snapshot()
    assert book["alice"]["rejected"] == 0 and book["alice"]["grader_timeouts"] == 0, book["alice"]
    assert intake.book.get("alice").grade_s < 0.1
    warm_up()          # leave the grader's killed workers restarted for the next test file
