"""Re-grade the committed evals with today's refusal rules: which answers scored correct then and
would be refused now (an eval keeps each item's extracted answer and reference, so no model runs).

    .venv/bin/python -m experiments.regrade_evals [--runs docs/runs] [--json docs/runs/regrade-evals.json]

Only refusals can have changed (the answer comparison is the same), so an item stays correct when
it was correct and no refusal applies to it now. Prints one row per eval file whose accuracy
changes, and the totals; the rows are what docs/results.md reads a grader change's effect from.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.repro import records
from ftis_edge.tasks.rewards import bare_answer_refusal, computation_refusal

ROOT = Path(__file__).resolve().parents[1]

MATH_TASKS = ("arith", "gsm8k", "math500")      # graded by the math rule (the refusals apply)


def refusal(answer: str, reference: str) -> str | None:
    return bare_answer_refusal(answer, reference) or computation_refusal(answer, reference)


def regrade(evaluation: dict) -> dict:
    """Accuracy as stored and as graded now, and the answers now refused, of one eval."""
    items = evaluation.get("items") or []
    was = [bool(it.get("correct")) for it in items]
    now = [c and refusal(str(it.get("answer") or ""), str(it.get("reference"))) is None
           for c, it in zip(was, items)]
    n = len(items) or 1
    refused = [{"id": it.get("id"), "answer": it.get("answer"), "reference": it.get("reference")}
               for c, k, it in zip(was, now, items) if c and not k]
    return {"n": len(items), "accuracy_was": sum(was) / n, "accuracy_now": sum(now) / n, "refused": refused}


def eval_files(runs: Path) -> list[Path]:
    """Every eval record under RUNS by its plain name (records.py finds a .gz copy)."""
    return sorted({p.with_name(p.name.removesuffix(records.GZ)) for p in runs.rglob("eval-*.json*")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "docs" / "runs")
    ap.add_argument("--json", type=Path, help="also write every changed eval's rows here")
    args = ap.parse_args(argv)
    rows, items, correct, refused = [], 0, 0, 0
    for path in eval_files(args.runs):
        evaluation = json.loads(records.read_bytes(path))
        if evaluation.get("task") not in MATH_TASKS:
            continue
        r = regrade(evaluation)
        items += r["n"]
        correct += round(r["accuracy_was"] * r["n"])
        refused += len(r["refused"])
        if r["refused"]:
            rows.append({"eval": str(path.relative_to(args.runs)), **r})
    print(f"| eval | n | accuracy then | now | answers now refused (first 3) |\n|---|---|---|---|---|")
    for r in rows:
        shown = "; ".join(f"`{x['answer']}` for {x['reference']}" for x in r["refused"][:3])
        print(f"| {r['eval']} | {r['n']} | {r['accuracy_was']:.3f} | {r['accuracy_now']:.3f} | {shown} |")
    print(f"\n{refused} of {correct} correct answers in {items} graded items are refused now; "
          f"{len(rows)} eval file(s) change")
    if args.json:
        args.json.write_text(json.dumps({"refused": refused, "correct": correct, "items": items,
                                         "changed": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
