"""experiments/regrade_evals.py on the committed evals: today's grading rules refuse no answer the
runs counted correct (moved from tests/test_grader_limits.py: the product's tests import only the
product)."""
from __future__ import annotations

import json
from pathlib import Path


def test_no_correct_answer_in_the_committed_evals_is_refused_by_todays_rules():
    """Every committed eval re-graded with the refusals (experiments/regrade_evals.py): the honest
    answers the runs gave — SmolLM2, Gemma 3, full fine-tuning, GSM8K, MATH-500 — all still count."""
    from experiments import regrade_evals
    runs = Path(__file__).resolve().parents[1] / "docs" / "runs"
    checked = 0
    for path in regrade_evals.eval_files(runs):
        evaluation = json.loads(regrade_evals.records.read_bytes(path))
        if evaluation.get("task") in regrade_evals.MATH_TASKS and "h6-grader-hole" not in str(path):
            r = regrade_evals.regrade(evaluation)
            checked += round(r["accuracy_was"] * r["n"])
            assert not r["refused"], (path, r["refused"][:3])
    assert checked > 10_000
