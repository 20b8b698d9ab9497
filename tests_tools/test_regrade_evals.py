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
    # issue 62.4: two numbers with only space between them are an operation (math-verify reads
    # "12 4" as 16); the one committed answer of that shape is a stutter, "1 1" for 1
    decided = {("arith/L1/1000000020", "1 1")}
    checked = 0
    for path in regrade_evals.eval_files(runs):
        evaluation = json.loads(regrade_evals.records.read_bytes(path))
        if evaluation.get("task") in regrade_evals.MATH_TASKS and "h6-grader-hole" not in str(path):
            r = regrade_evals.regrade(evaluation)
            checked += round(r["accuracy_was"] * r["n"])
            refused = [x for x in r["refused"] if (x["id"], str(x["answer"]).strip()) not in decided]
            assert not refused, (path, refused[:3])
    assert checked > 10_000
