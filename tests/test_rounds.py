"""One round (rounds.py) on fake parts (tests/round_parts.py): no model, no relay, seconds.

The round's own logic — seeds, the record, batch fill, which peers are admitted and marked
useful, its counters — checked without the parts that take minutes to load. A real node on the
real model and a real relay stays the end-to-end check (test_node.py, test_fill.py, test_heldout.py).
"""
from __future__ import annotations

import dataclasses

import pytest

from ftis_edge.run.guard import ALONE
from ftis_edge.metrics.metric_keys import unregistered
from ftis_edge.peers.outcomes import OutcomeBook
from ftis_edge.tasks.base import Prompt
from ftis_edge.peers.worth import OTHER_TOKENIZER, SAME_MODEL, SAME_TOKENIZER, WorthBook
from ftis_edge.run.rounds import GATES, Round, derive_seed, fill_slots
from round_parts import RELAY, Swarm, make_cfg, make_parts, peer_groups

# an alone round's record, in order (metrics.jsonl keeps this order); Learner.step's stats after micro_batch
ALONE_KEYS = ["round", "time/gen_s", "gen/tokens", "gen/tok_s", "completions/mean_length", "groups/topped_up",
              "time/train_s", "time/sync_s", "reward/own", "reward/peers", "reward", "accuracy/own", "format/own",
              "reward/timed_out", "reward/refused", "samples/own", "peers/samples_used", "samples/masked_truncated",
              "peers/refused_length", "peers/false_tokenizer_claims", "peers/refused_untokenizable",
              "peers/skipped_other_tokenizer", "peers/success_weight",
              "frac_reward_zero_std",
              "groups/with_peer_parts", "peers/groups_used", "memory/oom_retries", "micro_batch", "learning_rate",
              "loss", "samples", "version", "kl/own_mean", "train/diverging", "groups/own_signal_frac", "peers",
              "cpu/gen_s", "cpu/grade_s", "cpu/intake_s", "cpu/train_s", "cpu/sync_s", "cpu/round_s", "cpu/total_s",
              "gen/tokens_total", "groups/own", "peers/share", "peers/saved_groups", "peers/saved_frac", "time/round_s"]
PEER_KEYS = ["time/peer_wait_s", "wire/bytes_per_token_in", "peers/groups_received", "peers/rejected",
             "peers/stale", "peers/skipped_zero_advantage", "peers/skipped_peer_cap", "peers/skipped_surplus"]


def test_an_alone_rounds_record_has_the_keys_of_a_round_in_their_order(tmp_path):
    parts = make_parts(tmp_path, make_cfg())
    rec = Round(parts, 1).run()
    assert list(rec) == ALONE_KEYS and unregistered(rec) == []
    assert rec["round"] == 1 and rec["groups/own"] == 4 and rec["gen/tokens"] == 4 * 4 * 3
    assert rec["peers/groups_used"] == 0 and rec["groups/topped_up"] == 0 and rec["peers/saved_frac"] is None
    assert rec["samples/own"] == len(parts.learner.batches[0]) and rec["version"] == 1
    assert parts.totals.tokens == rec["gen/tokens_total"] == 48
    rec2 = Round(parts, 2, oom_retries=3).run()
    assert rec2["gen/tokens_total"] == 96 and rec2["memory/oom_retries"] == 3     # the run's, carried in


def test_prompts_and_sampling_seeds_are_a_function_of_seed_node_and_round(tmp_path):
    a, b = make_parts(tmp_path, make_cfg()), make_parts(tmp_path, make_cfg())
    ra, rb = Round(a, 3).run(), Round(b, 3).run()
    assert a.generator.seeds == b.generator.seeds == [derive_seed(5, "me", 3, i) for i in range(4)]
    assert ra["reward/own"] == rb["reward/own"] and ra["samples/own"] == rb["samples/own"]
    assert [s.completion_ids for s in a.learner.batches[0]] == [s.completion_ids for s in b.learner.batches[0]]
    assert [p.id for p in Round(a, 3).prompts()] == [f"arith-5-{i}" for i in range(8, 12)]


def test_a_round_owns_its_counters(tmp_path):
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0}),
                       swarm=Swarm(arrivals=[peer_groups()]))
    first = Round(parts, 1)
    rec = first.run()
    assert first.wire_in.nbytes == 3000 and first.wire_out.ntokens == 4 * 4 * 3
    assert rec["wire/bytes_per_token_in"] == pytest.approx(3000 / sum(len(c.token_ids) for g in peer_groups()
                                                                      for c in g.rollout.completions))
    second = Round(parts, 2)
    assert (second.wire_in.nbytes, second.wire_out.nbytes, second.excluded["guard"]) == (0, 0, 0)
    assert second.run()["wire/bytes_per_token_in"] is None         # nothing arrived in round 2


def test_batch_fill_with_no_peers_tops_up_to_the_isolated_batch(tmp_path):
    alone = make_parts(tmp_path, make_cfg())
    fill = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 0.2}), swarm=Swarm())
    assert fill_slots(fill.cfg, fill.swarm) == 3 and fill_slots(alone.cfg, None) is None
    a, f = Round(alone, 2).run(), Round(fill, 2).run()
    assert f["groups/topped_up"] == 3 and f["groups/own"] == 4 and f["peers/groups_used"] == 0
    assert f["time/peer_wait_s"] <= 0.2 + 0.5                       # waits for peers, never beyond max_wait_s
    assert fill.generator.seeds == alone.generator.seeds              # the same prompts' seeds, in two calls
    for key in ("gen/tokens", "reward/own", "samples/own", "loss"):
        assert f[key] == a[key], key
    assert [s.completion_ids for s in fill.learner.batches[0]] == [s.completion_ids for s in alone.learner.batches[0]]
    assert len(fill.swarm.published) == 4 and fill.swarm.polls[0] == 0.0   # own minimum, then the top-up, shared


def test_batch_fill_takes_peers_groups_instead_of_generating_them(tmp_path):
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 5.0,
                                                        "max_groups_per_peer": 1}),
                       swarm=Swarm(arrivals=[[], peer_groups()]))
    rec = Round(parts, 1).run()
    assert rec["groups/own"] == 1 and rec["groups/topped_up"] == 0 and rec["peers/groups_used"] == 3
    # saved: each group at what it weighed in the step; the other tokenizer's 8 samples share the
    # learner's bound of 1/8 a step (plausibility.FOREIGN_STEP_WEIGHT), so that group saved 1/64
    assert rec["peers/saved_groups"] == pytest.approx(2 + 1 / 64)
    assert rec["peers/saved_frac"] == pytest.approx((2 + 1 / 64) / 4) and rec["time/peer_wait_s"] < 5.0   # no wait once ready
    assert parts.generator.seeds == [derive_seed(5, "me", 1, 0)]     # the own minimum: prompt 0 only
    assert list(rec)[1:1 + len(PEER_KEYS)] == PEER_KEYS
    # every peer whose samples trained with a learning signal is marked useful for the relay's budget
    assert parts.swarm.useful == [{"peer-0", "peer-1", "peer-2"}]
    assert {n for n, s in rec["peers"].items() if s["samples_used"]} == {"peer-0", "peer-1", "peer-2"}


def test_the_gates_are_one_list_applied_in_order_and_each_drop_is_counted_once(tmp_path):
    """The round's gates rewrite intake's buffer in one place, one gate after another: a group the
    guard keeps out is not counted again by the later gate that would also have dropped it."""
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 0.0}),
                       swarm=Swarm(arrivals=[peer_groups()]), guard=True)
    parts.sample_rules = dataclasses.replace(parts.sample_rules, other_tokenizer=False)     # a node's default
    rnd = Round(parts, 1)
    assert [name for name, _ in rnd.gates()] == ["guard", "other_tokenizer"] and GATES[:2] == ("guard", "other_tokenizer")
    parts.guard.level = 2                       # another tokenizer's peer (peer-1) is the guard's first to go
    parts.intake.buffer = peer_groups()
    rnd.admit()
    assert [g.rollout.node_id for g in parts.intake.buffer] == ["peer-0", "peer-2"]
    assert rnd.excluded == {"guard": 1, "other_tokenizer": 0, "worth": 0, "kin": 0}
    parts.guard.level = 0                       # the guard open: the other-tokenizer gate drops peer-1
    parts.intake.buffer = peer_groups()
    rnd.admit(only=("guard",))
    assert len(parts.intake.buffer) == 3 and rnd.excluded["other_tokenizer"] == 0      # only the guard asked
    rnd.admit()
    assert [g.rollout.node_id for g in parts.intake.buffer] == ["peer-0", "peer-2"] and rnd.excluded["other_tokenizer"] == 1
    parts.intake.buffer = []
    rec = Round(parts, 1).run()                 # a whole round: its own counts, in the record
    assert rec["peers/skipped_other_tokenizer"] == 1 and rec["swarm/guard_excluded"] == 0
    assert rec["peers/groups_used"] == 2 and {s.source for s in parts.learner.batches[0]} == {"own", "peer-0", "peer-2"}
    trains_all = make_parts(tmp_path, make_cfg(RELAY), swarm=Swarm())      # SampleRules: other tokenizers trained
    assert [name for name, _ in Round(trains_all, 1).gates()] == []


def test_the_guards_gate_on_a_rounds_peers(tmp_path):
    """At each guard level the round keeps only the peer groups it admits (counted in the record);
    a node the guard has training alone takes no peer group and does not wait for one."""
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 3.0}),
                       swarm=Swarm(), guard=True)
    rnd = Round(parts, 1)
    for level, kept in [(0, ["peer-0", "peer-1", "peer-2"]), (1, ["peer-0", "peer-1", "peer-2"]),
                        (2, ["peer-0", "peer-2"]), (3, ["peer-0"]), (ALONE, [])]:
        parts.guard.level = level
        parts.intake.buffer = peer_groups()
        rnd.admit(only=("guard",))
        assert [g.rollout.node_id for g in parts.intake.buffer] == kept, level
        assert rnd.peer_limit(8) == (0 if level == ALONE else 8)
    assert rnd.excluded["guard"] == 1 + 2 + 3
    parts.intake.buffer = []
    parts.swarm.arrivals = [peer_groups()]
    rec = Round(parts, 2).run()
    assert rec["swarm/guard_level"] == ALONE and rec["peers/groups_used"] == 0 and rec["swarm/guard_excluded"] == 3
    assert rec["time/peer_wait_s"] < 1.0 and parts.swarm.polls == [0.0]      # no wait for peers it would not take
    assert unregistered(rec) == []


def test_fill_by_worth_keeps_out_a_kind_not_worth_a_slot_and_generates_its_slot(tmp_path):
    """Another tokenizer's samples counted 0.05 of ours: its group does not fill a slot (the node
    generates it), same-tokenizer peers still do; the record says so per kind."""
    worth = WorthBook()
    worth.observe(0, [1.0, 0.0, 0.0, 0.0], [(OTHER_TOKENIZER, [1.0, 0.0, 0.0, 0.0]), (SAME_MODEL, [1.0, 0.0, 0.0, 0.0]),
                                           (SAME_TOKENIZER, [1.0, 0.0, 0.0, 0.0])],
                  [(OTHER_TOKENIZER, 0.05)] * 8 + [(SAME_MODEL, 1.0)] * 8 + [(SAME_TOKENIZER, 0.9)] * 8)
    assert not worth.allows(OTHER_TOKENIZER) and worth.allows(SAME_MODEL) and worth.allows(SAME_TOKENIZER)
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 0.0, "fill_by_worth": True}),
                       swarm=Swarm(arrivals=[peer_groups()]))
    parts.worth = worth
    rec = Round(parts, 1).run()
    assert rec["worth/excluded"] == 1 and rec["peers/groups_used"] == 2 and rec["groups/topped_up"] == 1
    assert {s.source for s in parts.learner.batches[0]} == {"own", "peer-0", "peer-2"}
    assert rec["worth/other_tokenizer/used"] == 0 and rec["worth/same_model/used"] == 1
    assert unregistered(rec) == []


def test_when_no_kind_in_the_swarm_is_worth_a_slot_the_node_generates_its_batch_without_waiting(tmp_path):
    """The Gemma node of H6 among SmolLM2 peers: the only kind it has seen is kept out, so it does
    not wait swarm.max_wait_s each round for groups it would drop; it generates all B groups."""
    worth = WorthBook()
    worth.observe(0, [1.0, 0.0, 0.0, 0.0], [(OTHER_TOKENIZER, [1.0, 0.0, 0.0, 0.0])], [(OTHER_TOKENIZER, 0.05)] * 8)
    assert not worth.fills() and not WorthBook().fills()       # nothing measured yet: no slot on a guess
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 30.0, "fill_by_worth": True}),
                       swarm=Swarm())
    parts.worth = worth
    rec = Round(parts, 1).run()
    assert rec["time/peer_wait_s"] < 1.0 and rec["groups/own"] == 4 and rec["peers/groups_used"] == 0
    assert rec["groups/topped_up"] == 0                     # generated as its own batch, not as a shortfall
    assert unregistered(rec) == []


def test_outcomes_put_the_prompts_likeliest_to_carry_signal_first(tmp_path):
    """Peers' outcomes predict a prompt half right for this node: under batch fill the node
    generates that one itself, not the next prompt of its own stream."""
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 0.0,
                                                        "prompt_choice": "outcomes"}),
                       swarm=Swarm(arrivals=[peer_groups()]))
    parts.outcomes = OutcomeBook()
    parts.outcomes.add_own([1.0] * 7 + [0.0])        # this node is right 7 of 8 times: a fresh prompt rarely teaches
    answered = {g.prompt.id for g in peer_groups()}   # the peer groups arriving this round answer theirs
    for kind in (SAME_MODEL, OTHER_TOKENIZER, SAME_TOKENIZER):    # peers solve most prompts: half right is hard
        for i in range(4):
            answered.add(f"easy-{kind}-{i}")
            parts.outcomes.add_peer(0, Prompt(id=f"easy-{kind}-{i}", question="q", reference="0"), kind, [1.0] * 8)
    rnd = Round(parts, 1)
    rec = rnd.run()
    assert rec["prompts/from_outcomes"] >= 1 and rec["prompts/predicted_signal"] > 0.5
    assert rec["groups/own"] == 1 and unregistered(rec) == []
    chosen = rnd.choice.prompts[0]                   # outcomes' first pick, not the stream's arith-5-0
    assert chosen.id in answered, chosen.id
    own = [s for s in parts.learner.batches[0] if s.source == "own"]
    assert len(own) == 4 and all(s.prompt_ids == parts.bundle.encode(chosen.question) for s in own), own


def test_the_guards_first_rung_generates_every_group_and_takes_peers_only_on_top(tmp_path):
    """A false alarm of the guard's first rung costs compute, not learning: the node generates its
    whole batch, as alone, and peers' groups still come on top."""
    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 1, "max_wait_s": 0.0}),
                       swarm=Swarm(arrivals=[[], peer_groups()]), guard=True)
    parts.guard.fills = True
    parts.guard.level = 1
    rec = Round(parts, 1).run()
    assert rec["groups/own"] == 4 and rec["groups/topped_up"] == 0 and rec["swarm/guard_level"] == 1
    assert parts.generator.seeds == [derive_seed(5, "me", 1, i) for i in range(4)]
