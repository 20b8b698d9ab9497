"""The user's view of batch fill (issue 28): running-mean reward against the node's own
generated tokens and own CPU-seconds, swarm arms (own1, own2) vs the isolated twins (one line per node).

    .venv/bin/python -m experiments.repro.plot_fill --runs docs/runs/fill --batch fill4 --out docs/img/fill4-own-compute.png
    .venv/bin/python -m experiments.repro.plot_fill --runs docs/runs/fill --batch fill-hetero --per-node \
        --out docs/img/fill-hetero-own-compute.png

--per-node: one panel per node (the heterogeneous swarm's nodes differ in model and reward
level), each arm's run of that node against its own generated tokens.
"""
from __future__ import annotations

import argparse
from itertools import accumulate
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.repro import records  # (published records: plain or gzip-compressed)

COLORS = {"alone": "tab:gray", "own1": "tab:blue", "own2": "tab:green", "ftis": "tab:blue", "nois": "tab:red"}


def running_mean(rs: list[dict]) -> list[float]:
    rewards = [r.get("reward/own") or 0.0 for r in rs]
    return [s / (i + 1) for i, s in enumerate(accumulate(rewards))]


def cumulative(rs: list[dict], key: str, scale: float) -> list[float]:
    return [v / scale for v in accumulate(r.get(key) or 0 for r in rs)]


def runs_of(runs: Path, batch: str, seed: int) -> list[tuple[str, int, list[dict]]]:
    """(arm, node index, rounds) of every run of one batch and seed."""
    out = []
    for run in sorted((runs / batch / f"s{seed}").iterdir()):
        if run.is_dir() and records.exists(run / "metrics.jsonl"):
            arm, i = run.name.rsplit("-", 1)
            out.append((arm, int(i), records.rounds(run)))
    return out


def plot_per_node(runs: list[tuple[str, int, list[dict]]], batch: str, kinds: list[str]) -> plt.Figure:
    nodes = sorted({i for _, i, _ in runs})
    fig, axes = plt.subplots(1, len(nodes), figsize=(4 * len(nodes), 3.8), squeeze=False)
    for ax, i in zip(axes[0], nodes):
        for arm, j, rs in runs:
            if j == i:
                ax.plot(cumulative(rs, "gen/tokens", 1e3), running_mean(rs), color=COLORS.get(arm, "k"), label=arm)
        ax.set_title(f"node {i}: {kinds[i]}" if i < len(kinds) else f"node {i}", fontsize=9)
        ax.set_xlabel("own generated tokens (thousands)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("running mean of reward/own")
    fig.suptitle(f"{batch}: each node in the f-tis swarm, the nois swarm and alone; swarm nodes generate 1 of 4 groups")
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("docs/runs/fill"))
    ap.add_argument("--batch", default="fill4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/fill4-own-compute.png"))
    ap.add_argument("--per-node", action="store_true", help="one panel per node, own tokens only")
    args = ap.parse_args()
    if args.per_node:
        from analyze import HETERO_KIND
        fig = plot_per_node(runs_of(args.runs, args.batch, args.seed), args.batch, list(HETERO_KIND))
        fig.tight_layout()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
        print(args.out)
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    seen = set()
    for arm, _, rs in runs_of(args.runs, args.batch, args.seed):
        for ax, key, scale in ((axes[0], "gen/tokens", 1e3), (axes[1], "cpu/round_s", 60.0)):
            ax.plot(cumulative(rs, key, scale), running_mean(rs), color=COLORS.get(arm, "k"), alpha=0.8,
                    label=arm if arm not in seen else None)
        seen.add(arm)
    axes[0].set_xlabel("own generated tokens (thousands, cumulative)")
    axes[1].set_xlabel("own process CPU (minutes, cumulative)")
    for ax in axes:
        ax.set_ylabel("running mean of reward/own")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{args.batch}: each line one node over 32 rounds; an ownK node generates K of its 4 groups "
                 "a round, an alone node all 4")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
