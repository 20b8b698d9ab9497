"""The reproduction's node files stay valid as the config schema evolves (no model is loaded)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ftis_edge import config
from procs import ROOT

sys.path.insert(0, str(Path(ROOT) / "experiments" / "repro"))
import batches  # noqa: E402
import run  # noqa: E402


@pytest.mark.parametrize("name", sorted(batches.BATCHES))
def test_every_batch_writes_valid_configs(name, tmp_path):
    batch = batches.BATCHES[name]
    cfgs = run.receiver_configs(batch, 0, 8, tmp_path, "tcp://127.0.0.1:5555", f"repro-{name}-s0")
    assert set(cfgs) == set(batch.receivers)
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    # Paired design: every receiver sees the same prompts and sampling seeds and never shares.
    assert len({(c.node_id, c.node.seed) for c in loaded.values()}) == 1
    assert all(not c.swarm.share for c in loaded.values())
    for n, c in loaded.items():
        assert c.mode == ("alone" if n == "alone" else batch.collaboration)
        assert c.train.trainable == "lora" and c.model.spec == "smollm2-135m"


def test_the_sweep_has_paper_thresholds_and_one_below():
    gs = sorted(c["train"]["kl_threshold"] for c in batches.BATCHES["sweep"].receivers.values())
    g5 = batches.BATCHES["methods"].receivers["f-tis"]["train"]["kl_threshold"]
    assert {1.0, 5.0} <= set(gs + [g5]) and min(gs) < 1.0


def test_merge_is_deep_and_later_wins():
    assert batches.merge({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}, "b": 4}) == {"a": {"x": 1, "y": 3}, "b": 4}
