"""Summarise a run directory: reward per round and early-vs-late means with standard errors.

    python -m experiments.summarize_run RUN_DIR [RUN_DIR ...] [--window 10]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from ftis_edge.metrics.records import read_metrics, read_rounds
from ftis_edge.metrics.stats import mean_se


def summarize(run_dir: Path, window: int) -> None:
    rounds = read_rounds(run_dir)
    start = next((r for r in read_metrics(run_dir) if r.get("type") == "start"), {})
    train = start.get("config", {}).get("train", {})
    lr = train.get("learning_rate", train.get("lr"))     # runs recorded by 0.1.0 say "lr"
    print(f"## {run_dir}  (node {start.get('node_id')}, {start.get('collaboration')}, lr {lr})")
    print("| round | reward/own | reward/peers | accuracy/own | format/own | samples own+peers | dropped | IS w mean | KL mean | round s |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def f(v, p=3):
        return "–" if v is None else f"{v:.{p}f}"
    for r in rounds:
        print(f"| {r['round']} | {f(r.get('reward/own'))} | {f(r.get('reward/peers'))} | "
              f"{f(r.get('accuracy/own'))} | {f(r.get('format/own'))} | "
              f"{r.get('samples/own', 0)}+{r.get('peers/samples_used', 0)} | {f(r.get('filter/dropped'), 0)} | "
              f"{f(r.get('sampling/importance_sampling_ratio/mean', r.get('is/weight_mean')))} | "
              f"{f(r.get('kl/mean'), 4)} | {f(r.get('time/round_s'), 0)} |")
    own = [r["reward/own"] for r in rounds if r.get("reward/own") is not None]
    if len(own) >= 2 * window:
        (m1, s1), (m2, s2) = mean_se(own[:window]), mean_se(own[-window:])
        print(f"\nreward/own rounds 1-{window}: {m1:.3f} ± {s1:.3f} (SE);  "
              f"rounds {len(own) - window + 1}-{len(own)}: {m2:.3f} ± {s2:.3f} (SE);  "
              f"difference {m2 - m1:+.3f} ({(m2 - m1) / math.hypot(s1, s2):.1f} SE)")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--window", type=int, default=10)
    args = ap.parse_args()
    for d in args.run_dirs:
        summarize(d, args.window)


if __name__ == "__main__":
    main()
