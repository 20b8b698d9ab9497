"""The reasoning-gym learning run of docs/tasks.md ("Does it learn?"): its summary and plot.

    .venv/bin/python -m experiments.gym_run docs/runs/gym/smollm2-gym [--plot docs/img/gym-reward.png]

Reads RUN/metrics.jsonl (or its .gz, as docs/runs keeps it) and the before/after evals
RUN/eval-base.json and RUN/eval-trained.json (`ftis-edge eval --json`, same held-out prompts,
greedy), prints the per-round table, the first-5 vs last-5 reward means and the evals with their
95% Wilson intervals, and draws the reward curve beside the eval bars. Every number comes from those files.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.repro import records
from ftis_edge.metrics.stats import mcnemar_two_sided, mean_se

WINDOW = 5
EVALS = (("base", "eval-base.json"), ("trained", "eval-trained.json"))


def load(run_dir: Path) -> tuple[list[dict], dict]:
    rounds = records.rounds(run_dir)
    evals = {label: json.loads(records.read_bytes(run_dir / name)) for label, name in EVALS
             if records.exists(run_dir / name)}
    return rounds, evals


def by_dataset(ev: dict) -> dict[str, tuple[int, int]]:
    """dataset -> (correct, n) from the eval's items (prompt ids are rg/<dataset>/<key>/<i>)."""
    out: dict[str, list[int]] = {}
    for it in ev.get("items", []):
        c = out.setdefault(it["id"].split("/")[1], [0, 0])
        c[0] += it["reward"] >= 1.0
        c[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def report(rounds: list[dict], evals: dict) -> list[str]:
    lines = ["| round | reward/own | accuracy/own | format/own | round s |", "|---|---|---|---|---|"]
    for r in rounds:
        lines.append(f"| {r['round']} | {r.get('reward/own', 0):.3f} | {r.get('accuracy/own', 0):.3f} | "
                     f"{r.get('format/own', 0):.3f} | {r.get('time/round_s', 0):.0f} |")
    for key in ("reward/own", "accuracy/own", "format/own"):
        xs = [r.get(key) or 0.0 for r in rounds]
        if len(xs) >= 2 * WINDOW:
            (m1, s1), (m2, s2) = mean_se(xs[:WINDOW]), mean_se(xs[-WINDOW:])
            lines.append(f"\n{key}: rounds 1-{WINDOW} {m1:.3f} ± {s1:.3f} (SE), "
                         f"rounds {len(xs) - WINDOW + 1}-{len(xs)} {m2:.3f} ± {s2:.3f} (SE)")
    from ftis_edge.metrics.stats import wilson_interval
    lines.append("\n| model | n | accuracy | 95% CI | format ok | per dataset (correct/n) |\n|---|---|---|---|---|---|")
    for label, ev in evals.items():
        lo, hi = ev["accuracy_ci95"]
        parts = []
        for ds, (k, n) in by_dataset(ev).items():
            a, b = wilson_interval(k, n)
            parts.append(f"{ds} {k}/{n} ({a:.0%}–{b:.0%})")
        lines.append(f"| {label} | {ev['n']} | {ev['accuracy']:.1%} | {lo:.1%} – {hi:.1%} | "
                     f"{ev['format_rate']:.1%} | {'; '.join(parts)} |")
    if len(evals) == 2:
        lines.append("\n" + paired(*evals.values()))
    return lines


def paired(before: dict, after: dict) -> str:
    """Same prompts, greedy: how many only one of the two got right, and the exact McNemar p."""
    a, b = before["items"], after["items"]
    if [x["id"] for x in a] != [x["id"] for x in b]:
        return "the two evals did not use the same prompts"
    lost = sum(x["reward"] >= 1.0 > y["reward"] for x, y in zip(a, b))
    won = sum(y["reward"] >= 1.0 > x["reward"] for x, y in zip(a, b))
    p = mcnemar_two_sided(won, lost)
    return f"paired: {won} prompts right only after training, {lost} only before (exact McNemar p = {p:.4f})"


def plot(rounds: list[dict], evals: dict, path: Path) -> None:
    from ftis_edge.common.install_hint import require      # the bench extra: say how to install it
    matplotlib = require("matplotlib", "the gym_run plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.6, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    xs = [r["round"] for r in rounds]
    for key, style in (("reward/own", "o-"), ("format/own", "s--"), ("accuracy/own", "^:")):
        ax.plot(xs, [r.get(key) or 0.0 for r in rounds], style, ms=3, label=key)
    ax.set_xlabel("round")
    ax.set_ylabel("mean over the round's 32 completions")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    labels = list(evals)
    acc = [evals[k]["accuracy"] for k in labels]
    err = [[a - evals[k]["accuracy_ci95"][0] for k, a in zip(labels, acc)],
           [evals[k]["accuracy_ci95"][1] - a for k, a in zip(labels, acc)]]
    bx.bar(labels, acc, yerr=err, capsize=4, color=["C7", "C0"][: len(labels)])
    n = evals[labels[0]]["n"] if labels else 0
    bx.set_ylabel(f"held-out greedy accuracy (n = {n}, 95% CI)")
    bx.grid(axis="y", alpha=0.3)
    fig.suptitle("SmolLM2-135M LoRA on reasoning-gym (chain_sum + basic_arithmetic + leg_counting, easiest)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--plot", type=Path, default=None, help="write the PNG here")
    args = ap.parse_args()
    rounds, evals = load(args.run_dir)
    print("\n".join(report(rounds, evals)))
    if args.plot:
        plot(rounds, evals, args.plot)


if __name__ == "__main__":
    main()
