"""Compute accounting (ftis_edge/metrics/compute.py): process CPU by phase, totals that survive a
checkpoint, the share peers supplied, and the phrase the headless line shows."""
from __future__ import annotations

import time

import pytest

from ftis_edge import config
from ftis_edge.metrics.compute import ComputeTotals, CpuClock, round_compute, saved_phrase
from ftis_edge.run.logs import round_line


def _spin(cpu_s: float) -> None:
    t0 = time.process_time()
    while time.process_time() - t0 < cpu_s:
        sum(i * i for i in range(1000))


def test_the_clock_counts_process_cpu_per_phase_not_wall_time():
    clock = CpuClock()
    with clock.measure("train"):
        _spin(0.2)
    with clock.measure("sync"):
        time.sleep(0.3)                 # waiting costs no CPU: a wall clock would count 0.3 s
    assert clock.seconds["train"] >= 0.2 and clock.seconds["sync"] < 0.05
    assert clock.seconds["gen"] == 0.0 and clock.round_s() >= clock.seconds["train"]


def test_totals_accumulate_across_rounds_and_a_checkpoint():
    totals = ComputeTotals()
    r1 = round_compute(CpuClock(), totals, tokens=100, own_groups=1, peer_groups=3, fill=True)
    assert r1["peers/share"] == 0.75 and r1["peers/saved_frac"] == 0.75 and r1["gen/tokens_total"] == 100
    restored = ComputeTotals.from_state(totals.state())          # what --resume does
    r2 = round_compute(CpuClock(), restored, tokens=400, own_groups=4, peer_groups=0, fill=True)
    assert r2["gen/tokens_total"] == 500 and r2["peers/saved_frac"] == 3 / 8 and r2["peers/share"] == 0.0
    assert r2["cpu/total_s"] == pytest.approx(r1["cpu/round_s"] + r2["cpu/round_s"])
    on_top = round_compute(CpuClock(), ComputeTotals(), tokens=9, own_groups=4, peer_groups=12, fill=False)
    assert on_top["peers/saved_frac"] is None and on_top["peers/share"] == 0.75
    assert ComputeTotals.from_state(None) == ComputeTotals()    # a checkpoint from before accounting


def test_the_round_line_says_what_the_swarm_saved():
    rec = {"round": 5, "reward/own": 0.5, "accuracy/own": 0.5, "loss": 0.01, "filter/dropped": 0,
           "gen/tok_s": 100.0, "peers/groups_received": 3, "peers/groups_used": 3, "peers/rejected": 0,
           "peers/stale": 0, "time/round_s": 9.0, "groups/own": 1, "peers/saved_frac": 0.58}
    assert saved_phrase(rec) == "swarm supplied 3 of 4 groups; 58% of your generation saved so far"
    assert round_line(rec, swarm=True).endswith(
        "0 dropped, swarm supplied 3 of 4 groups; 58% of your generation saved so far, 9.0 s")
    rec.update({"peers/saved_frac": None, "groups/own": 4, "peers/groups_used": 12})
    assert saved_phrase(rec) == "swarm added 12 groups to your 4"
    assert saved_phrase({"round": 1}) is None


def test_own_groups_cannot_exceed_the_batch():
    with pytest.raises(config.ConfigError, match="swarm.own_groups"):
        config.from_dict({"task": {"prompts_per_round": 4}, "swarm": {"own_groups": 5}})
    assert config.from_dict({"task": {"prompts_per_round": 4}, "swarm": {"own_groups": 1}}).swarm.own_groups == 1
