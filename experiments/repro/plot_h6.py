"""H6 and H8 as the user sees them: each node's held-out accuracy against its own generated
tokens, in the swarm (per arm) and alone, every seed.

    .venv/bin/python -m experiments.repro.plot_h6 --runs docs/runs/h6 --out docs/img/h6-heldout-own-tokens.png
    .venv/bin/python -m experiments.repro.plot_h6 --runs docs/runs/h8 --batch h8 --out docs/img/h8-heldout-own-tokens.png

One panel per node. Thin lines: the in-run held-out eval (32 prompts, every 8 rounds) against the
node's cumulative own tokens, one line per seed. Big markers: the final weights' accuracy on the
200 ID prompts, mean over the seeds (± SE when there are several), placed at the mean own tokens of
that arm. A swarm node that is no worse off ends level with its twin, about 3x further left.
"""
from __future__ import annotations

import argparse
import sys
from itertools import accumulate
from pathlib import Path
from statistics import mean, stdev

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.repro import records  # (published records: plain or gzip-compressed)

NODES = ("0: SmolLM2 LoRA", "1: SmolLM2 LoRA", "2: SmolLM2 full FT (HF)", "3: Gemma 3 LoRA (other tokenizer)")
ARMS = (("alone", "tab:gray", "alone (twin)"), ("protect", "tab:blue", "swarm, protections on"),
        ("ftis", "tab:orange", "swarm, protections off (default)"))
# Each batch: its node titles, its arms (name, colour, label) and the figure's title.
BATCHES = {
    "h6": (NODES, ARMS, "H6"),
    "h8": (("0: SmolLM2 base LoRA", "1: SmolLM2 base LoRA", "2: arith-L6 expert LoRA (same tokenizer)",
            "3: arith-L6 expert LoRA (same tokenizer)"),
           (("alone", "tab:gray", "alone (twin)"), ("nois", "tab:red", "swarm, NoIS (peers' text as own)"),
            ("ftis", "tab:orange", "swarm, F-TIS (default)")), "H8"),
}


def in_run_curve(run: Path) -> tuple[list[float], list[float]]:
    """(own tokens so far, in thousands; held-out accuracy) at each in-run eval, round 0 first."""
    rounds = records.rounds(run)
    tokens = list(accumulate(r.get("gen/tokens") or 0 for r in rounds))
    xs, ys = [], []
    for r, t in zip(rounds, tokens):
        if "eval/base_accuracy" in r and not xs:
            xs.append(0.0)
            ys.append(r["eval/base_accuracy"])
        if "eval/accuracy" in r:
            xs.append(t / 1000)
            ys.append(r["eval/accuracy"])
    return xs, ys


def seeds(batch_dir: Path) -> list[Path]:
    return sorted(p for p in batch_dir.glob("s*") if p.is_dir() and p.name[1:].isdigit())


def finished_runs(batch_dir: Path, name: str) -> list[Path]:
    """The seeds' runs of NAME that have their final ID eval (a run still going has none)."""
    return [s / name for s in seeds(batch_dir) if records.exists(s / name / "eval-id.json")]


def final_point(runs: list[Path]) -> tuple[float, float, float] | None:
    """(mean own tokens in thousands, mean final ID accuracy, its SE over seeds)."""
    if not runs:
        return None
    acc = [float(records.eval_of(r, "id")["accuracy"]) for r in runs]
    tok = [sum(r.get("gen/tokens") or 0 for r in records.rounds(run)) / 1000 for run in runs]
    se = stdev(acc) / len(acc) ** 0.5 if len(acc) > 1 else 0.0
    return mean(tok), mean(acc), se


def plot(batch_dir: Path, out: Path, batch: str = "h6") -> list[str]:
    nodes, arms, name = BATCHES[batch]
    fig, axes = plt.subplots(1, len(nodes), figsize=(16, 4.2), sharey=True)
    said = []
    for i, (ax, title) in enumerate(zip(axes, nodes)):
        for arm, color, label in arms:
            runs = finished_runs(batch_dir, f"{arm}-{i}")
            for run in runs:
                ax.plot(*in_run_curve(run), color=color, alpha=0.45, lw=1)
            point = final_point(runs)
            if point is None:
                continue
            x, y, se = point
            ax.errorbar([x], [y], yerr=[se], fmt="o", ms=8, color=color, capsize=4,
                        label=f"{label}: {y:.3f} ID, {len(runs)} seed{'s' * (len(runs) > 1)}")
            said.append(f"node {i} {arm}: final ID {y:.3f} ± {se:.3f} over {len(runs)} seed(s), "
                        f"{x:.1f}k own tokens")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("own tokens generated (thousands)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("held-out greedy accuracy")
    fig.suptitle(f"{name}: lines = in-run eval (32 prompts) per seed; markers = final weights on 200 ID prompts, "
                 "mean ± SE over seeds", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("docs/runs/h6"), help="publish.py's DEST for h6")
    ap.add_argument("--batch", default="h6", choices=sorted(BATCHES))
    ap.add_argument("--out", type=Path, default=Path("docs/img/h6-heldout-own-tokens.png"))
    args = ap.parse_args(argv)
    batch_dir = args.runs / args.batch
    if not seeds(batch_dir):
        ap.error(f"{batch_dir}: no seed directories (sN) to plot")
    for line in plot(batch_dir, args.out, args.batch):
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
