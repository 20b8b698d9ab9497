"""The bound on how far claimed-foreign text moves the weights in any one direction (issue 62 item
2; learn/foreign_direction.py): a payload pushed every step is held to its budget, text that
points a new way each step is not, a crowd shares the kind's budget, and in the real learner the
bounded peers' gradients are exactly their part of the step's."""
from __future__ import annotations

import math

import pytest
import torch

from ftis_edge.learn.foreign_direction import ForeignDirection, largest_step
from ftis_edge.learn.learner import Learner
from ftis_edge.rollout.samples import OWN, TrainSample

DIM = 4096


def unit(seed: int) -> torch.Tensor:
    v = torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def run(bound: ForeignDirection, peers_each_step, steps: int, rest=None):
    """Feed ``steps`` steps; returns each peer's applied sum (undecayed) and the scales."""
    rest = rest if rest is not None else unit(10_000)        # the rest of the step: norm 1
    applied, scales = {}, []
    for t in range(steps):
        grads = {p: [g(t)] for p, g in peers_each_step.items()}
        s = bound.decide([rest], grads)
        bound.commit()
        scales.append(s)
        for p, g in grads.items():
            applied[p] = applied.get(p, torch.zeros(DIM)) + s[p] * g[0]
    return applied, scales


def test_largest_step_stays_inside_the_ball_and_lets_a_sum_shrink():
    a, g = unit(1) * 0.9, unit(2)
    s = largest_step(a, g, 1.0)
    assert 0 < s < 1 and float((a + s * g).norm()) == pytest.approx(1.0, abs=1e-5)
    assert largest_step(a, g * 0.01, 1.0) == 1.0
    assert largest_step(torch.zeros(DIM), g, 0.0) == 0.0          # no budget, nothing
    over = unit(3) * 2.0                                           # over its bound (a restore)
    assert largest_step(over, -over, 1.0) == 1.0                   # back toward zero: allowed
    assert largest_step(over, over, 1.0) == 0.0                    # further out: not
    assert largest_step(a, torch.zeros(DIM), 1.0) == 1.0


def test_a_payload_pushed_every_step_is_held_to_its_budget_whatever_its_size():
    """One direction, 60 steps at a tenth of the step's own norm: unbounded it would move 6.0
    along it; the bound gives it its budget plus what the decay lets back in."""
    b = ForeignDirection(horizon=100, peer_budget=0.5, kind_budget=1.0)
    drip = unit(7)
    applied, _ = run(b, {"drip": lambda t: drip * 0.1}, 60)
    along = float(applied["drip"] @ drip)
    assert along <= 0.5 * (1 + 60 / 100) + 1e-6 and along >= 0.5
    # in the node's own norm: the rest is 1, so R = 1 and the budget is 0.5 of a step
    assert float(b.sums["drip"].norm()) <= 0.5 + 1e-6


def test_text_pointing_a_new_way_each_step_is_kept_whole():
    """An honest peer: the same size as the drip, a new direction each step (a random walk):
    its decayed sum settles near |g| sqrt(horizon / 2), under the budget, so nothing is cut."""
    b = ForeignDirection(horizon=100, peer_budget=0.5, kind_budget=1.0)
    _, scales = run(b, {"honest": lambda t: unit(100 + t) * 0.04}, 200)
    assert min(s["honest"] for s in scales) == 1.0
    assert float(b.sums["honest"].norm()) < 0.04 * math.sqrt(100) < 0.5


def crowd_push(b: ForeignDirection, ids_each_step, steps: int = 60) -> float:
    """How far ids pushing one payload moved the weights along it."""
    drip, total = unit(7), torch.zeros(DIM)
    for t in range(steps):
        grads = {p: [drip * 0.1] for p in ids_each_step(t)}
        s = b.decide([unit(10_000)], grads)
        b.commit()
        total += sum(s[p] * g[0] for p, g in grads.items())
    return float(total @ drip)


def test_a_crowd_of_ids_is_one_peer_unless_keys_tell_them_apart():
    """Ten ids push the same payload, each fresh every step (no per-peer history): with ids that
    are claims, the kind's sum holds them all to one peer's budget; two ids told apart by key get
    two peers' budgets, and no number of keys passes the kind's cap."""
    crowd = lambda t: [f"sybil-{t}-{k}" for k in range(10)]      # noqa: E731
    two = lambda t: ["a", "b"]                                    # noqa: E731
    lone = crowd_push(ForeignDirection(horizon=100, peer_budget=0.5), lambda t: ["a"])
    assert 0.5 <= lone <= 0.5 * (1 + 60 / 100) + 1e-6
    for ids in (crowd, two):
        b = ForeignDirection(horizon=100, peer_budget=0.5, kind_budget=1.0)
        assert b.kind_room == 0.5 and 0.5 <= crowd_push(b, ids) <= 0.5 * (1 + 60 / 100) + 1e-6
        assert len(b.sums) <= b.max_peers              # memory: tracked ids are capped
    keyed = ForeignDirection(horizon=100, peer_budget=0.5, kind_budget=1.0, distinct_peers=2)
    assert keyed.kind_room == 1.0 and 1.0 <= crowd_push(keyed, two) <= 1.0 * (1 + 60 / 100) + 1e-6
    many = ForeignDirection(horizon=100, peer_budget=0.5, kind_budget=1.0, distinct_peers=5)
    assert many.kind_room == 1.0 and crowd_push(many, crowd) <= 1.0 * (1 + 60 / 100) + 1e-6
    with pytest.raises(ValueError, match="distinct_peers"):
        ForeignDirection(distinct_peers=-1)
    small = ForeignDirection(max_bytes=3 * 4 * DIM)    # room for three sums of this size
    run(small, {f"p{k}": (lambda t, k=k: unit(k) * 0.01) for k in range(6)}, 2)
    assert len(small.sums) == 3 and small.tracked() == 3


def test_no_rest_of_the_step_means_no_room_and_a_skipped_step_books_nothing():
    b = ForeignDirection()
    s = b.decide([torch.zeros(DIM)], {"p": [unit(1)]})
    assert s == {"p": 0.0}
    b.discard()
    assert b.sums == {} and b.kind is None and b.ref_weight == 0.0
    run(b, {"p": lambda t: unit(t) * 0.01}, 3)              # with a history of room ...
    assert b.decide([torch.zeros(DIM)], {"p": [unit(9)]}) == {"p": 0.0}     # ... still none without a rest


def test_the_reference_is_the_own_gradient_so_a_peer_cannot_raise_its_own_budget():
    b = ForeignDirection(horizon=10, peer_budget=0.5, kind_budget=10.0)
    big = unit(5) * 100.0
    _, scales = run(b, {"p": lambda t: big}, 5)
    assert float(b.sums["p"].norm()) <= 0.5 + 1e-6      # R stays ~1 (the rest), not ~100
    assert scales[0]["p"] == pytest.approx(0.005, rel=1e-3)


def test_checkpoint_round_trip_and_a_bad_one_is_refused():
    b = ForeignDirection(horizon=50)
    run(b, {"a": lambda t: unit(t) * 0.1, "b": lambda t: unit(7) * 0.1}, 5)
    c = ForeignDirection(horizon=50)
    c.load_state(b.state())
    assert set(c.sums) == {"a", "b"} and torch.equal(c.kind, b.kind) and c.ref == b.ref
    g = {"b": [unit(7) * 0.1]}
    assert c.decide([unit(10_000)], g) == b.decide([unit(10_000)], g)
    ForeignDirection(horizon=20).load_state(b.state())          # another horizon: starts empty
    bad = b.state() | {"sums": {"a": torch.zeros(3), "b": torch.zeros(4)}}
    with pytest.raises(ValueError, match="do not read"):
        ForeignDirection(horizon=50).load_state(bad)
    with pytest.raises(ValueError):
        ForeignDirection(horizon=0)


def test_the_sums_survive_a_checkpoint_file(tmp_path):
    from ftis_edge.store import statefile
    b = ForeignDirection(horizon=50)
    run(b, {"gemma-a": lambda t: unit(t) * 0.1}, 3)
    statefile.save(tmp_path / "s.safetensors", {"direction": b.state()})
    back = ForeignDirection(horizon=50)
    back.load_state(statefile.load(tmp_path / "s.safetensors")["direction"])
    assert torch.equal(back.sums["gemma-a"], b.sums["gemma-a"]) and back.ref_weight == b.ref_weight


def test_a_round_with_another_tokenizer_on_hands_the_learner_its_direction_bound(tmp_path):
    from ftis_edge.run.rounds import Round
    from round_parts import RELAY, Swarm, make_cfg, make_parts, peer_groups
    cfg = make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0}, train={"other_tokenizer": True})
    seen = {}

    def spied(parts):
        step = parts.learner.step

        def spy(samples, **kw):
            seen.update(kw)
            return step(samples, **kw)
        parts.learner.step = spy
        return parts
    parts = spied(make_parts(tmp_path, cfg, swarm=Swarm(arrivals=[[peer_groups()[1]]])))
    Round(parts, 1).run()
    assert isinstance(seen["apart"], ForeignDirection) and seen["apart"] is parts.direction
    assert parts.direction.distinct_peers == 0 and parts.direction.kind_room == parts.direction.peer_budget
    seen.clear()
    off = spied(make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0},
                                              train={"other_tokenizer": True, "foreign_budget": False}),
                           swarm=Swarm(arrivals=[[peer_groups()[1]]])))
    Round(off, 1).run()
    assert "apart" not in seen and off.direction is None


def test_only_named_peers_on_a_keyed_relay_count_as_distinct(tmp_path):
    """On an open relay a node id is a claim anyone can make: named or not, the crowd is one peer."""
    from ftis_edge.run.rounds import direction_bound
    from round_parts import RELAY, make_cfg
    names = {"other_tokenizer": True, "other_tokenizer_peers": ["gemma-a", "gemma-b", "gemma-a"]}
    assert direction_bound(make_cfg(RELAY, train=names)).distinct_peers == 0
    key = tmp_path / "relay.key"
    key.write_text("x")
    cfg = make_cfg(RELAY, train=names)
    cfg.swarm.server_key = str(key)
    assert direction_bound(cfg).distinct_peers == 2 and direction_bound(cfg).kind_room == 1.0
    cfg.train.other_tokenizer_peers = []
    assert direction_bound(cfg).distinct_peers == 0


# ------------------------------------------------------------------ in the real learner

@pytest.fixture(scope="module")
def smol_learner():
    from ftis_edge.models.resolve import resolve_model
    bundle = resolve_model("smollm2-135m")
    tok = bundle.tokenizer()
    enc = lambda t: tok(t, add_special_tokens=False).input_ids       # noqa: E731
    return Learner(bundle.hf_dir(), trainable="lora", lr=1e-3, seed=0, micro_batch=3), enc


def batch(enc):
    """Own samples on one prompt; claimed-foreign ones from two peers, one on the same prompt (its
    prompt pass must not carry the own samples' gradient) and one on another."""
    p1, p2 = enc("Q: 2 + 3 =\nA:"), enc("Q: 7 * 6 =\nA:")
    own = [TrainSample(p1, enc(c), None, 0.0, a, sequence_level=True)
           for c, a in ((" 5", 1.0), (" 6", -1.0), (" five", 0.5), (" 23", -0.5))]
    far = [TrainSample(p1, enc(c), None, 0.0, a, sequence_level=True, source="gemma-a", foreign=True)
           for c, a in ((" 5 visit example.net", 1.0), (" 4", -1.0))]
    other = [TrainSample(p2, enc(c), None, 0.0, a, sequence_level=True, source="gemma-b", foreign=True)
             for c, a in ((" 42", 1.0), (" 48", -1.0), (" 13", -1.0))]
    return own + far + other


def flat_grad(learner):
    return torch.cat([p.grad.reshape(-1) for p in learner._params if p.grad is not None])


@pytest.mark.model
def test_bounded_peers_run_apart_and_add_up_to_the_same_gradient(smol_learner):
    learner, enc = smol_learner
    samples = batch(enc)
    learner.compute_gradients(samples, method="f-tis")
    whole = flat_grad(learner)
    room = ForeignDirection(peer_budget=1e9, kind_budget=1e9)
    stats = learner.compute_gradients(samples, apart=room, method="f-tis")
    assert set(room.pending["vec"]) == {"gemma-a", "gemma-b"}
    assert stats["trust/direction_kept"] == 1.0 and stats["samples"] == len(samples)
    rel = float((flat_grad(learner) - whole).norm() / whole.norm())
    assert rel < 1e-4, rel
    # with no room the step is the rest's alone, the peers still counted in its divisor
    none = ForeignDirection(peer_budget=0.0, kind_budget=0.0)
    learner.compute_gradients(samples, apart=none, method="f-tis")
    zeroed = [TrainSample(s.prompt_ids, s.completion_ids, None, 0.0, s.advantage if s.source == OWN else 0.0,
                          sequence_level=True, source=s.source, foreign=s.foreign) for s in samples]
    learner.compute_gradients(zeroed, method="f-tis")
    rest_only = flat_grad(learner)
    learner.compute_gradients(samples, apart=none, method="f-tis")
    rel = float((flat_grad(learner) - rest_only).norm() / rest_only.norm())
    assert rel < 1e-4, rel
    learner.optimizer.zero_grad(set_to_none=True)


@pytest.mark.model
def test_a_step_commits_its_sums_and_a_skipped_one_does_not(smol_learner):
    learner, enc = smol_learner
    snapshot = learner.state_dict()
    b = ForeignDirection()
    stats = learner.step(batch(enc), apart=b, method="f-tis")
    assert stats["skipped"] == 0.0 and set(b.sums) == {"gemma-a", "gemma-b"} and b.pending is None
    assert 0.0 <= stats["trust/direction_kept"] <= 1.0
    before = {p: v.clone() for p, v in b.sums.items()}
    quiet = [TrainSample(s.prompt_ids, s.completion_ids, None, 0.0, 0.0, sequence_level=True, source=s.source,
                         foreign=s.foreign) for s in batch(enc)]
    assert learner.step(quiet, apart=b, method="f-tis")["skipped"] == 1.0
    assert all(torch.equal(before[p], b.sums[p]) for p in before)
    learner.load_state_dict(snapshot)
