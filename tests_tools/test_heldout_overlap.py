"""experiments/heldout_overlap.py on the committed runs: the report in docs/tasks.md (moved from
tests/test_unseen.py: the product's tests import only the product)."""


def test_h4_to_h6_id_evals_overlapped_their_training_by_text():
    """The committed runs' ID evals (before this rule) shared questions with training: the
    report in docs/tasks.md comes from experiments/heldout_overlap.py."""
    from pathlib import Path

    from experiments.heldout_overlap import study_rows, summary
    rows = study_rows(Path(__file__).resolve().parents[1] / "docs" / "runs", {})
    h6 = [r for r in rows if r["study"] == "H6"]
    assert len(h6) == 36
    share = sum(r["own"] for r in h6) / sum(r["n"] for r in h6)
    assert 0.15 < share < 0.25
    assert "| H6 | 36 |" in summary(rows)
