"""Which peer groups a vertical node trains on (``Intake.take``), on real SmolLM2 rollouts
through the real wire and the real intake: informative groups first (zero-advantage ones
only where informative ones leave room), spread over peers with at most ``per_peer`` of
one, each peer's newest first; the round counts say what was skipped and why."""
from __future__ import annotations

import pytest

from ftis_edge.rollout.samples import carries_signal
from ftis_edge.generate.base import SamplerSettings
from ftis_edge.peers.book import PeerBook
from ftis_edge.peers.intake import Intake, ids_decoder
from ftis_edge.peers.swarm import Received
from ftis_edge.tasks import get_task
from ftis_edge.rollout.wire import Rollout, WireCompletion, decode, encode

pytestmark = [pytest.mark.model, pytest.mark.timeout(900), pytest.mark.slow]  # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
G = 4


@pytest.fixture(scope="module")
def task():
    return get_task("arith", reward="shaped")     # format credit: most real groups have mixed rewards


@pytest.fixture(scope="module")
def real_groups(smol, task):
    """Real llama.cpp groups as (prompt, completions, informative?): informative ones (40 new
    tokens, graded by the task as intake grades them) and zero-advantage ones (1 new token:
    no answer tags, every reward 0)."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    gen = LlamaCppGenerator.from_bundle(smol, "f16", n_ctx=512, max_group=G, n_threads=2)
    informative, zero = [], []
    try:
        for k, prompt in zip(range(14), task.prompts(seed=11)):
            ids = smol.encode(smol.render_prompt(task.messages(prompt.question)))
            if len(zero) < 2:
                zero.append((prompt, gen.generate(ids, G, SamplerSettings(temperature=1.0, max_new_tokens=1,
                                                                          seed=k))))
                continue
            comps = gen.generate(ids, G, SamplerSettings(temperature=1.0, max_new_tokens=40, seed=k))
            rewards = [v for v, _ in task.reward_many([c.text for c in comps], [prompt.reference] * G)]
            if carries_signal(rewards):
                informative.append((prompt, comps))
            if len(informative) == 6:
                break
    finally:
        gen.close()
    assert len(informative) == 6, "fewer than 6 of 12 real groups had mixed rewards"
    return informative, zero


def wire(smol, node, prompt, comps) -> Received:
    r = Rollout(node_id=node, swarm="s", task="arith", prompt_id=prompt.id, group_size=G,
                completions=[WireCompletion(token_ids=c.token_ids, logprobs=c.logprobs, text=c.text, reward=0.0,
                                            finish_reason=c.finish_reason) for c in comps],
                vocab_size=smol.vocab_size, model_fp=smol.fingerprint, tokenizer_fp=smol.tokenizer_fingerprint,
                temperature=1.0)
    return Received(rollout=decode(encode(r)), sender=node, nbytes=1)


def test_informative_groups_first_spread_over_peers_newest_first(smol, task, real_groups):
    informative, zero = real_groups
    intake = Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp=smol.tokenizer_fingerprint,
                    vocab_size=smol.vocab_size, book=PeerBook(), decode=ids_decoder(smol.tokenizer()),
                    stop_ids=smol.eos_token_ids)
    # peer a: 4 informative groups and a zero-advantage one; b: one of each; c: one informative
    sent = [("a", *informative[0]), ("a", *zero[0]), ("b", *informative[1]), ("a", *informative[2]),
            ("b", *zero[1]), ("c", *informative[3]), ("a", *informative[4]), ("a", *informative[5])]
    intake.receive([wire(smol, node, p, comps) for node, p, comps in sent], current_round=1)
    assert len(intake.buffer) == len(sent)                      # every real rollout passed intake
    assert len({g.rollout.prompt_id for g in intake.buffer}) == len(sent)    # a prompt id names a group

    taken = intake.take(1, limit=3, per_peer=2)
    assert all(carries_signal(g.rewards) for g in taken)
    # one group of each peer, each its newest informative one, peers in order of their newest group
    assert [(g.rollout.node_id, g.rollout.prompt_id) for g in taken] == [
        ("a", informative[5][0].id), ("c", informative[3][0].id), ("b", informative[1][0].id)]
    counts = intake.pop_round_counts()
    assert counts["skipped_zero_advantage"] == 2          # informative groups filled the batch
    assert counts["skipped_peer_cap"] == 2                # a's 3rd and 4th newest informative groups
    assert counts["skipped_surplus"] == 1                 # a's 2nd newest: within the cap, the batch was full
    assert counts["stale"] == 0
    # the zero-advantage groups left the buffer (never useful); the informative rest waits
    assert sorted(g.rollout.prompt_id for g in intake.buffer) == sorted(
        p.id for p, _ in (informative[0], informative[2], informative[4]))
    nxt = intake.take(2, limit=8, per_peer=2)
    assert [g.rollout.prompt_id for g in nxt] == [informative[4][0].id, informative[2][0].id]
    assert intake.pop_round_counts()["skipped_peer_cap"] == 1


def test_zero_advantage_groups_only_fill_what_informative_ones_leave(smol, task, real_groups):
    informative, zero = real_groups
    intake = Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp=smol.tokenizer_fingerprint,
                    vocab_size=smol.vocab_size, book=PeerBook(), decode=ids_decoder(smol.tokenizer()),
                    stop_ids=smol.eos_token_ids)
    sent = [("a", *informative[0]), ("b", *zero[0]), ("a", *zero[1]), ("b", *informative[1])]
    intake.receive([wire(smol, node, p, comps) for node, p, comps in sent], current_round=1)
    taken = intake.take(1, limit=3)
    # both informative groups (b's is the newest), then the newest zero-advantage one fills the slot left
    assert [(g.rollout.node_id, carries_signal(g.rewards)) for g in taken] == [("b", True), ("a", True), ("a", False)]
    assert intake.pop_round_counts()["skipped_zero_advantage"] == 1
    assert intake.buffer == []                # the zero-advantage group left over is dropped, not kept
