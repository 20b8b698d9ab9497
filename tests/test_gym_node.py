"""A real node (SmolLM2-135M, llama.cpp, LoRA) trains one round on a reasoning-gym mix."""
from __future__ import annotations

import pytest

from ftis_edge.metrics.metric_keys import unregistered
from ftis_edge.metrics.records import read_metrics
from procs import finish, start_node, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]   # a real node end to end


def test_a_node_trains_a_round_on_a_reasoning_gym_mix_and_tags_its_rollouts(tmp_path):
    cfg = write_config(tmp_path, "rg", node={"rounds": 1},
                       task={"name": "reasoning_gym", "datasets": {"chain_sum": {}, "leg_counting": {"weight": 2}}})
    finish(start_node(cfg))
    records = read_metrics(tmp_path / "rg")
    assert [r["type"] for r in records] == ["start", "base_eval", "round", "stop"]
    r = records[2]
    assert unregistered(r) == [] and 0.0 <= r["reward/own"] <= 1.0 and r["gen/tokens"] > 0
    saved = (tmp_path / "rg" / "config.toml").read_text()
    assert "chain_sum" in saved and "leg_counting" in saved, saved
