"""The user's view of batch fill (issue 28): running-mean reward against the node's own
generated tokens and own CPU-seconds, swarm arm vs the isolated twins (one line per node).

    .venv/bin/python experiments/repro/plot_fill.py --runs docs/runs/fill --batch fill4 --out docs/img/fill4-own-compute.png
"""
from __future__ import annotations

import argparse
import sys
from itertools import accumulate
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ftis_edge.metrics import read_metrics  # noqa: E402

COLORS = {"alone": "tab:gray", "own1": "tab:blue", "own2": "tab:green", "ftis": "tab:blue", "nois": "tab:red"}


def rounds(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r.get("type") == "round"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("docs/runs/fill"))
    ap.add_argument("--batch", default="fill4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/fill4-own-compute.png"))
    args = ap.parse_args()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    seen = set()
    for run in sorted((args.runs / args.batch / f"s{args.seed}").iterdir()):
        if not run.is_dir() or not read_metrics(run):
            continue
        arm = run.name.rsplit("-", 1)[0]
        rs = rounds(run)
        rewards = [r.get("reward/own") or 0.0 for r in rs]
        running = [s / (i + 1) for i, s in enumerate(accumulate(rewards))]
        for ax, key, scale in ((axes[0], "gen/tokens", 1e3), (axes[1], "cpu/round_s", 60.0)):
            x = [v / scale for v in accumulate(r.get(key) or 0 for r in rs)]
            ax.plot(x, running, color=COLORS.get(arm, "k"), alpha=0.8, label=arm if arm not in seen else None)
        seen.add(arm)
    axes[0].set_xlabel("own generated tokens (thousands, cumulative)")
    axes[1].set_xlabel("own process CPU (minutes, cumulative)")
    for ax in axes:
        ax.set_ylabel("running mean of reward/own")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{args.batch}: each line one node over 32 rounds; swarm nodes generate 1 of their 4 groups")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
