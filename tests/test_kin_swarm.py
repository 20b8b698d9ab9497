"""Kin fill end to end (issue 65): two real SmolLM2 nodes on a real relay with swarm.fill = "kin".
A node starts without kin (it generates its whole batch and says so in node.log), measures its
peer's samples without training on them, then gives that twin at most half its slots."""
from __future__ import annotations

import pytest

from procs import RelayProc, finish_all, rounds_of, start_node, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1800)]
B = 2                                    # procs.TINY: prompts_per_round


def test_twins_become_kin_and_fill_at_most_half_the_batch(tmp_path):
    relay = RelayProc()
    relay.wait_ready()
    rounds = 5
    common = {"swarm": {"relay": relay.address, "own_groups": 1, "max_wait_s": 120.0, "fill": "kin"},
              "node": {"rounds": rounds}, "task": {"num_generations": 8}}
    a = start_node(write_config(tmp_path, "a", **common))
    b = start_node(write_config(tmp_path, "b", **common))
    finish_all(a, b, relay=relay, timeout=1700)
    for me in ("a", "b"):
        recs = rounds_of(tmp_path / me)
        assert len(recs) == rounds
        first = recs[0]
        assert first["kin/peers"] == 0 and first["groups/own"] == B and first["peers/groups_used"] == 0
        assert first["kin/said"] == f"no peer of your kind: you generate {B} of {B} groups"
        for r in recs:
            assert r["groups/own"] + r["peers/groups_used"] == B                   # always a full batch
            assert r["peers/groups_used"] <= B * r["kin/peers"] // (r["kin/peers"] + 1)   # one kin: half
            assert 0.0 <= r["peers/saved_groups"] <= r["peers/groups_used"]
        assert sum(r["kin/measured"] for r in recs) >= 1                            # measured first ...
        filled = [r for r in recs if r["peers/groups_used"]]
        assert filled, recs                                                         # ... then filled
        assert all(r["kin/peers"] == 1 for r in filled)
        assert sum(r["peers/saved_groups"] for r in filled) > 0.5 * len(filled)    # a twin weighs near-full
        log = (tmp_path / me / "node.log").read_text()
        assert f"no peer of your kind: you generate {B} of {B} groups" in log
        assert "1 peer of your kind" in log
