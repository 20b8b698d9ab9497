"""The batch-fill pilot's numbers (docs/results.md, issue 28 plan): cost per node-round, the
paired SD per round, the top-up rate, and R by the pre-registered rule.

    .venv/bin/python -m experiments.repro.pilot --runs runs/fill-pilot [--budget-h 5]

Cost of an invocation at R rounds = R × (the slowest of its nodes' mean wall seconds per
round, rounds >= 2: the first round also loads the model) + its measured start-up and eval
time; the rule: R = the largest multiple of 4 <= 32 for which fill4 + fill-hetero (one seed,
the four invocations of the plan) fit the budget.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from ftis_edge.metrics.records import read_rounds

ROOT = Path(__file__).resolve().parents[2]

# the plan's four invocations: (batch, receiver prefixes run together)
INVOCATIONS = [("fill4", ("own1", "alone")), ("fill4", ("own2",)),
               ("fill-hetero", ("ftis", "alone")), ("fill-hetero", ("nois",))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "fill-pilot")
    ap.add_argument("--budget-h", type=float, default=5.0)
    ap.add_argument("--overhead-s", type=float, default=300.0, help="start-up + evals per invocation (measured: see the pilot log)")
    args = ap.parse_args()
    per_inv = []
    for batch, prefixes in INVOCATIONS:
        d = args.runs / batch / "s0"
        runs = sorted(p for p in d.iterdir() if p.is_dir() and p.name.rsplit("-", 1)[0] in prefixes) if d.exists() else []
        if not runs and batch == "fill-hetero" and prefixes == ("nois",):
            runs = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("ftis-"))   # same nodes, same cost
            note = " (not run in the pilot: the ftis arm's cost)"
        else:
            note = ""
        walls, cpus = [], []
        print(f"\n{batch} {'+'.join(prefixes)}{note}")
        for r in runs:
            rs = read_rounds(r)
            w = [x["time/round_s"] for x in rs[1:] if x.get("time/round_s")]
            c = [x["cpu/round_s"] for x in rs[1:] if x.get("cpu/round_s")]
            t = [x.get("groups/topped_up", 0) for x in rs]
            walls.append(statistics.fmean(w) if w else float("nan"))
            cpus.append(statistics.fmean(c) if c else float("nan"))
            print(f"  {r.name:8s} rounds {len(rs)}  wall/round {walls[-1]:6.1f} s  cpu/round {cpus[-1]:6.1f} s  "
                  f"topped up/round {statistics.fmean(t) if t else 0:.2f}  tokens/round "
                  f"{statistics.fmean([x.get('gen/tokens', 0) for x in rs]) if rs else 0:.0f}")
        per_inv.append(max(walls) if walls else float("nan"))
    print("\nwall seconds per round of each invocation (its slowest node):", [f"{w:.0f}" for w in per_inv])
    best = None
    for R in range(4, 33, 4):
        hours = sum(R * w + args.overhead_s for w in per_inv) / 3600
        print(f"  R = {R:2d}: {hours:4.1f} h")
        if hours <= args.budget_h:
            best = R
    print(f"R by the rule (largest multiple of 4 <= 32 within {args.budget_h} h): {best}")
    # paired SD per round: reward/own(arm node i) - reward/own(alone-i), rounds >= 2
    diffs = []
    for batch, arm in (("fill4", "own1"), ("fill4", "own2"), ("fill-hetero", "ftis")):
        d = args.runs / batch / "s0"
        for i in range(4):
            a, b = read_rounds(d / f"{arm}-{i}"), read_rounds(d / f"alone-{i}")
            diffs += [x["reward/own"] - y["reward/own"] for x, y in zip(a[1:], b[1:])
                      if x.get("reward/own") is not None and y.get("reward/own") is not None]
    if len(diffs) > 1:
        print(f"paired SD per round (rounds >= 2, {len(diffs)} pairs): {statistics.stdev(diffs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
