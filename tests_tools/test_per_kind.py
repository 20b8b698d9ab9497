"""experiments/repro/per_kind.py: the README's per-kind figures (issue 65.8), read from the
committed H6 and H7 records with the seed as the unit."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.repro import per_kind
from experiments.repro.analyze import load_all

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def batches():
    return {name: recv for runs in ("h6", "h7") for name, recv in load_all(ROOT / "docs/runs" / runs).items()}


def test_seeds_of_two_batches_stay_apart_and_a_kinds_nodes_count_once_a_seed(batches):
    lora = per_kind.kind_pairs(batches, "ftis", (0, 1))
    assert len(lora) == 2 * (3 + 5)                       # both LoRA nodes, every seed of both batches
    d = per_kind.seed_diffs(lora)
    assert len(d) == 3 + 5                                # seed 0 of H6 is not seed 0 of H7
    h6, h7 = (per_kind.seed_diffs(per_kind.kind_pairs({b: batches[b]}, "ftis", (0, 1))) for b in ("h6", "h7"))
    assert sorted(d) == sorted(h6 + h7)                   # pooled = the batches' seeds side by side


def test_the_pooled_row_is_the_records_and_its_counts_add_up(batches):
    full = per_kind.kind_pairs(batches, "ftis", (2,))
    d = per_kind.seed_diffs(full)
    diff = sum(a["evals"]["id"]["accuracy"] - b["evals"]["id"]["accuracy"] for _, _, a, b in full)
    assert sum(d) == pytest.approx(diff)                  # one node a seed: the seeds' diffs are the pairs'
    row = per_kind.row("full fine-tuning, pooled", full)
    only_arm, only_alone = (int(x) for x in row.split(" | ")[6].split(",")[0].split(" / "))
    assert only_arm - only_alone == round(200 * diff)     # per prompt, right as the accuracy counts it
    # the reading the README repeats: in H7 the full-FT node ended below its twin on every seed
    h7_pairs = per_kind.kind_pairs({"h7": batches["h7"]}, "ftis", (2,))
    h7 = per_kind.seed_diffs(h7_pairs)
    assert len(h7) == 5 and all(x < 0 for x in h7) and "| 5 of 5 |" in per_kind.row("x", h7_pairs)
    assert per_kind.p_two_sided(h7) < 0.05 < per_kind.p_two_sided([0.01, -0.02, 0.015])


def test_own_share_counts_own_groups_against_all_trained():
    run = {"rounds": [{"groups/own": 4, "peers/groups_used": 0}, {"groups/own": 1, "peers/groups_used": 3}]}
    assert per_kind.own_share(run) == pytest.approx(5 / 8)
    assert per_kind.own_share({"rounds": [{}]}) is None


def test_the_worth_arm_generated_most_of_the_gemma_nodes_batch_itself(batches):
    lines = per_kind.own_shares(batches["h7"], "worth")
    gemma = next(line for line in lines if line.startswith("* worth-3:"))
    shares = [int(x.strip().rstrip("%")) for x in gemma.split("generated ")[1].split(" of ")[0].split(",")]
    assert len(shares) == 5 and min(shares) >= 70         # issue 65: it generated 73–93 % itself


def test_the_interval_is_students():
    assert per_kind.t_quantile(0.975, 2) == pytest.approx(4.303, abs=1e-3)       # tables of Student's t
    assert per_kind.t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    lo, hi = per_kind.interval([0.0, 0.1, 0.2])                                  # mean 0.1, SE 0.0577
    assert (lo, hi) == pytest.approx((0.1 - 4.303 * 0.057735, 0.1 + 4.303 * 0.057735), abs=1e-3)


def test_h8_has_its_own_kinds_and_does_not_pool_with_h6():
    h8 = load_all(ROOT / "docs/runs/h8")
    lines = per_kind.table({"h8": h8["h8"]}, "ftis")
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| base beside experts, h8", "| expert beside base nodes, h8"]
    expert = lines[-1].split(" | ")
    lo, hi = (float(x) for x in expert[3].split(" to "))
    assert lo < -5 and hi > 5                  # "level" on 3 seeds is a wide interval, not a small loss ruled out
