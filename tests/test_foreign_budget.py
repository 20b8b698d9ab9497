"""The budget on what claimed-foreign text moves (issue 62 item 2; learn/foreign_budget.py): the
update, not the weight — a step share, nothing without own signal, a per-peer and per-kind window."""
from __future__ import annotations

import pytest

from ftis_edge.learn.batch import learner_factors
from ftis_edge.learn.foreign_budget import ForeignBudget, claimed_foreign
from ftis_edge.peers.plausibility import PlausibilityConfig
from ftis_edge.rollout.samples import OWN, TrainSample
from ftis_edge.run.rounds import Round
from round_parts import RELAY, Swarm, make_cfg, make_parts, peer_groups


def own(adv=1.0, n=8):
    return [TrainSample([1], [2, 3], [-1.0, -1.0], None, adv if i % 2 else -adv) for i in range(n)]


def foreign(peer, n=2, adv=1.0):
    return [TrainSample([1], [4, 5], None, -2.0, adv, sequence_level=True, source=peer, foreign=True)
            for _ in range(n)]


def pull(samples, factors=None):
    factors = factors or [1.0] * len(samples)
    return sum(abs(s.advantage) * s.weight * f for s, f in zip(samples, factors) if claimed_foreign(s))


def test_without_own_signal_claimed_foreign_text_moves_nothing():
    b = ForeignBudget()
    out = b.apply(own(adv=0.0) + foreign("drip"))
    assert [s.weight for s in out if s.source == "drip"] == [0.0, 0.0]
    assert all(s.weight == 1.0 for s in out if s.source == OWN)       # own samples never touched
    assert b.spent() == ({}, 0.0)


def test_a_step_gives_claimed_foreign_text_at_most_its_share_of_the_pull():
    b = ForeignBudget(share=0.125, peer_budget=10.0, kind_budget=10.0)
    batch = own() + foreign("a", n=8) + foreign("b", n=8)
    out = b.apply(batch)
    rest = 8.0
    assert pull(out) / (rest + pull(out)) == pytest.approx(0.125)
    assert b.spent()[1] == pytest.approx(0.125)
    # token-level peers (judged by the learner) and own samples are never scaled
    twin = [TrainSample([1], [2, 3], [-1.0, -1.0], None, 1.0, source="twin")]
    assert b.apply(own() + twin) == own() + twin


def test_a_drip_spends_its_window_budget_and_then_moves_nothing_until_it_frees():
    """Two samples a step, full weight (the learner's bound off): the window caps what one peer
    takes over 20 steps at half of one step's pull, whatever it sends."""
    b = ForeignBudget(window=20, peer_budget=0.5, kind_budget=1.0)
    shares = []
    for _ in range(60):
        out = b.apply(own() + foreign("drip"))
        shares.append(pull(out) / (8.0 + pull(out)))
    for end in range(20, 61):
        assert sum(shares[end - 20:end]) <= 0.5 + 1e-9
    assert sum(shares) <= 0.5 * 3 + 1e-9 and shares[0] == pytest.approx(0.125)


def test_many_ids_share_one_kind_budget():
    b = ForeignBudget(window=20, peer_budget=0.5, kind_budget=1.0)
    total = 0.0
    for step in range(20):
        batch = own() + [s for i in range(10) for s in foreign(f"sybil-{step}-{i}", n=1)]
        out = b.apply(batch)
        total += pull(out) / (8.0 + pull(out))
    assert total <= 1.0 + 1e-9 and b.spent()[1] <= 1.0 + 1e-9


def test_with_the_learners_bound_an_honest_peer_stays_inside_the_budget():
    """Under the learner's 1/8-a-step bound an honest Gemma peer's 8 samples a step pull ~1.5 % of a
    step: 20 steps spend 0.31 of its 0.5, so none of its text is scaled further (kept whole)."""
    b, cfg = ForeignBudget(), PlausibilityConfig()
    for _ in range(40):
        batch = own() + foreign("gemma", n=8)
        out = b.apply(batch, learner_factors(batch, cfg))
        assert [s.weight for s in out] == [s.weight for s in batch]


def test_the_budget_survives_a_checkpoint(tmp_path):
    from ftis_edge.store import statefile
    b = ForeignBudget(window=4)
    for _ in range(6):
        b.apply(own() + foreign("drip"))
    statefile.save(tmp_path / "s.safetensors", {"budget": b.state()})
    back = ForeignBudget(window=4)
    back.load_state(statefile.load(tmp_path / "s.safetensors")["budget"])
    assert back.spent() == b.spent()
    nxt = own() + foreign("drip")
    assert [s.weight for s in back.apply(nxt)] == [s.weight for s in b.apply(nxt)]
    with pytest.raises(ValueError, match="share"):
        ForeignBudget(share=1.0)
    with pytest.raises(ValueError, match="does not read"):
        ForeignBudget(window=4).load_state({"window": 4, "steps": [["x"]]})


def test_a_round_with_another_tokenizer_on_bounds_it_and_caps_its_is_weight(tmp_path):
    cfg = make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0}, train={"other_tokenizer": True})
    parts = make_parts(tmp_path, cfg, swarm=Swarm(arrivals=[[peer_groups()[1]]]))
    seen = {}
    step = parts.learner.step

    def spy(samples, **kw):
        seen.update(kw)
        return step(samples, **kw)
    parts.learner.step = spy
    Round(parts, 1).run()
    assert seen["foreign_cap"] == 1.0 and parts.budget is not None and parts.budget.steps
    off = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 0}, train={"other_tokenizer": True,
                                                                                "foreign_budget": False}),
                     swarm=Swarm(arrivals=[[peer_groups()[1]]]))
    Round(off, 1).run()
    assert off.budget is None


@pytest.mark.model
def test_on_the_real_learner_a_drip_without_own_signal_leaves_the_weights_untouched(smol):
    """Issue 62.2's case: own groups with no advantage, the attacker's claimed-foreign samples the
    step's only signal. The learner's bound alone still steps (Adam rescales whatever is left);
    under the budget the step has no signal and the weights stay bit for bit."""
    import json
    from pathlib import Path

    import torch

    from ftis_edge.learn.learner import Learner
    g = json.loads((Path(__file__).parent / "data" / "real_rollouts.json").read_text())["groups"]
    own_ = [TrainSample(list(g[0]["prompt_ids"]), [int(t) for t in c["token_ids"]][:16],
                        [float(x) for x in c["logprobs"]][:16], None, 0.0) for c in g[0]["completions"][:4]]
    drip = [TrainSample(list(g[1]["prompt_ids"]), [int(t) for t in c["token_ids"]][:16], None,
                        float(sum(c["logprobs"][:16])), 1.0 if j == 0 else -1.0, sequence_level=True,
                        source="drip", foreign=True) for j, c in enumerate(g[1]["completions"][:2])]
    cfg = PlausibilityConfig()
    for budgeted in (False, True):
        learner = Learner(smol.hf_dir(), trainable="lora", lr=1e-3, seed=0, device="cpu")
        before = {k: v.clone() for k, v in learner.trainable_state().items()}
        batch = own_ + drip
        if budgeted:
            batch = ForeignBudget().apply(batch, learner_factors(batch, cfg))
        st = learner.step(batch, plausible=cfg, method="f-tis", C=2.0, foreign_cap=1.0 if budgeted else None)
        after = learner.trainable_state()
        moved = any(not torch.equal(before[k], after[k]) for k in before)
        assert moved != budgeted and st["skipped"] == float(budgeted), (budgeted, st.get("skipped"))


# --- train.other_tokenizer_peers: who may reach this path at all ----------------------------------

def test_only_the_named_peers_other_tokenizer_text_trains(tmp_path):
    """No budget tells a drip from an honest peer of the same pull (docs/relay.md), so the opt-in
    path can be narrowed to named peers: a stranger's (or a crowd's) such text fills no slot and
    is not trained, counted as skipped; the friend's trains, under the budget."""
    from ftis_edge.run.rounds import sample_rules_of
    kinds = (("friend", "other-tok", "gemma"), ("stranger", "other-tok", "gemma"))
    cfg = make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0},
                   train={"other_tokenizer": True, "other_tokenizer_peers": ["friend"]})
    parts = make_parts(tmp_path, cfg, swarm=Swarm(arrivals=[peer_groups(kinds)]))
    parts.sample_rules = sample_rules_of(parts.bundle, cfg.train)          # as Node.build makes them
    rec = Round(parts, 1).run()
    sources = {s.source for s in parts.learner.batches[0]}
    assert "friend" in sources and "stranger" not in sources
    assert rec["peers/skipped_other_tokenizer"] == 1 and rec["peers/groups_used"] == 1
    assert parts.budget is not None and set(parts.budget.spent()[0]) <= {"friend"}
    # the same arrivals with no names: both train (the path as it was)
    open_cfg = make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0}, train={"other_tokenizer": True})
    both = make_parts(tmp_path, open_cfg, swarm=Swarm(arrivals=[peer_groups(kinds)]))
    Round(both, 1).run()
    assert {"friend", "stranger"} <= {s.source for s in both.learner.batches[0]}


def test_the_batch_skips_another_tokenizers_text_from_a_peer_not_named():
    from ftis_edge.learn.batch import SampleRules
    rules = SampleRules(other_tokenizer=True, other_tokenizer_peers=frozenset({"friend"}))
    assert rules.trains_other("friend") and not rules.trains_other("friend-2") and not rules.trains_other("")
    assert SampleRules(other_tokenizer=True).trains_other("anyone")
    assert not SampleRules(other_tokenizer=False, other_tokenizer_peers=frozenset({"friend"})).trains_other("friend")


def test_naming_peers_without_the_path_on_is_a_clear_error_and_an_open_relay_is_said():
    from ftis_edge import config
    from ftis_edge.run.swarm_parts import trust_note
    with pytest.raises(config.ConfigError, match="other_tokenizer is off"):
        config.from_dict({"train": {"other_tokenizer_peers": ["friend"]}})
    with pytest.raises(config.ConfigError, match="none of them empty"):
        config.from_dict({"train": {"other_tokenizer": True, "other_tokenizer_peers": [" "]}})
    with pytest.raises(config.ConfigError, match="list"):
        config.from_dict({"train": {"other_tokenizer": True, "other_tokenizer_peers": "friend"}})
    relay = {"relay": "tcp://127.0.0.1:1"}
    assert trust_note(config.from_dict({"swarm": relay})) is None                   # the default: off
    assert "from any peer" in trust_note(config.from_dict({"swarm": relay, "train": {"other_tokenizer": True}}))
    named = config.from_dict({"swarm": relay, "train": {"other_tokenizer": True, "other_tokenizer_peers": ["friend"]}})
    assert "a claim anyone can make" in trust_note(named)
