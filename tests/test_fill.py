"""Batch fill (swarm.own_groups): peers' groups replace part of a node's own generation, the
batch stays task.prompts_per_round groups, and a swarm that is not there costs at most
swarm.max_wait_s. Real processes, a real relay on loopback, the real SmolLM2 model."""
from __future__ import annotations

import pytest

from procs import RelayProc, finish_all, rounds_of, start_node, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1200)]
B = 2                                    # procs.TINY: prompts_per_round


def test_with_no_peers_a_filling_node_tops_up_within_max_wait_and_trains_on_its_isolated_batch(tmp_path):
    relay = RelayProc()
    relay.wait_ready()
    settings = dict(node={"rounds": 2, "seed": 5})
    fill_dir, alone_dir = tmp_path / "fill", tmp_path / "alone"
    fill_dir.mkdir(), alone_dir.mkdir()
    fill = start_node(write_config(fill_dir, "n", swarm={"relay": relay.address, "own_groups": 1,
                                                         "max_wait_s": 3.0}, **settings))
    alone = start_node(write_config(alone_dir, "n", **settings))
    finish_all(fill, alone, relay=relay)
    filled, isolated = rounds_of(fill_dir / "n"), rounds_of(alone_dir / "n")
    assert len(filled) == len(isolated) == 2
    for f, a in zip(filled, isolated):
        assert f["groups/own"] == B and f["groups/topped_up"] == B - 1 and f["peers/groups_used"] == 0
        assert f["time/peer_wait_s"] <= 3.0 + 0.5                   # never waits beyond max_wait_s
        assert f["peers/saved_frac"] == 0.0 and f["peers/share"] == 0.0
        # the top-up uses the prompts and sampling seeds of the isolated node's same indices
        for key in ("gen/tokens", "reward/own", "completions/mean_length", "samples/own", "loss",
                    "gen/tokens_total", "groups/own"):
            assert f[key] == a[key], (f["round"], key, f[key], a[key])
        assert a["groups/topped_up"] == 0 and a["peers/saved_frac"] is None
        assert all(a[f"cpu/{p}_s"] >= 0.0 for p in ("gen", "grade", "intake", "train", "sync"))
        assert a["cpu/gen_s"] > 0.0 and a["cpu/round_s"] >= a["cpu/gen_s"] + a["cpu/train_s"]
    assert isolated[1]["cpu/total_s"] == pytest.approx(sum(r["cpu/round_s"] for r in isolated))


def test_with_a_real_second_node_each_generates_fewer_groups_and_the_batch_stays_full(tmp_path):
    relay = RelayProc()
    relay.wait_ready()
    rounds = 3
    common = {"swarm": {"relay": relay.address, "own_groups": 1, "max_wait_s": 120.0},
              "node": {"rounds": rounds}, "task": {"num_generations": 8}}
    a = start_node(write_config(tmp_path, "a", **common))
    b = start_node(write_config(tmp_path, "b", **common))
    finish_all(a, b, relay=relay)
    for me in ("a", "b"):
        recs = rounds_of(tmp_path / me)
        assert len(recs) == rounds
        for r in recs:
            assert r["groups/own"] + r["peers/groups_used"] == B           # always a full batch
            assert r["groups/own"] >= 1 and r["groups/topped_up"] == r["groups/own"] - 1   # own_groups = 1
        assert sum(r["groups/own"] for r in recs) < B * rounds, recs        # the peer stood in for some
        # saved: each peer group at the weight its samples carried in the step (issue 65): a twin's
        # weigh near-full, never more than a whole group
        for r in recs:
            assert 0.0 <= r["peers/saved_groups"] <= r["peers/groups_used"]
        assert recs[-1]["peers/saved_frac"] == pytest.approx(
            sum(r["peers/saved_groups"] for r in recs) / (B * rounds))
        assert recs[-1]["gen/tokens_total"] == sum(r["gen/tokens"] for r in recs)
