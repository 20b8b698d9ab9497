"""The attack benchmarks' own arithmetic: the grading attack's summary over ring secrets and the
claimed-foreign attack's request for the full IS weight (issue 62 items 2 and 3)."""
from __future__ import annotations

import math

from benchmarks.attacks.grading_sybils_clock import fair_level, summarise
from benchmarks.attacks.poison_foreign import CLAIMED_C, PROBES, Attack, family


def _run(honest, fair, first):
    return {"ids": 2000, "order": "together", "kind": "signal", "rounds": 20, "honest_graded": honest,
            "fair": fair, "share_of_fair": honest / fair if fair else None, "first_graded_round": first, "cpu_s": 1.0}


def test_the_summary_is_the_mean_over_secrets_beside_the_worst_run():
    runs = [_run(0.0, 0.4, None), _run(2.0, 0.4, 7), _run(0.0, 0.4, None), _run(4.0, 0.4, 3)]
    s = summarise(runs)
    assert s["share_of_fair"] == round((0 + 5 + 0 + 10) / 4, 3)       # the expectation a node has
    assert s["worst_share"] == 0.0 and s["runs_graded"] == 2
    assert s["first_graded_round"] == 7                                  # the median of those graded
    assert s["honest_graded"] == 1.5 and s["runs"] == runs


def test_fair_level_is_max_min_among_ids_wanting_one_group_and_the_honest_two():
    assert fair_level(41, 2000) == 41 / 2001            # fewer graded than ids: a per-id share
    assert fair_level(2001, 2000) == 1.0               # room for one more group than the ids
    assert fair_level(5000, 2000) == 2.0               # room for all: its whole demand


def test_a_c_attack_asks_for_the_full_truncated_weight_with_its_own_payload():
    assert family("templates3-c") == "templates3" and family("digits-c") == "digits"
    assert "sumhelper.net" in PROBES["templates3"]
    for name in ("templates3-c", "digits-c"):
        atk = Attack(name, setup=None)
        assert math.isclose(atk.claim, math.log(CLAIMED_C))            # behaviour log-prob log C below ours
        assert atk.ids_per_step == 1 and atk.poisoned_per_group == 2
    assert Attack("templates3", setup=None).claim == 0.0
