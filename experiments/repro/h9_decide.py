"""H9's pre-registered decision (docs/results.md, "H9, as registered"; issue 65 item 6), per kind.

    .venv/bin/python -m experiments.repro.h9_decide --runs docs/runs/h9 [--seed S]

Kinds: **SmolLM2 LoRA** (nodes 0, 1), **full fine-tuning** (node 2, SmolLM2 on HF), **Gemma 3
LoRA** (nodes 3, 4). Node i of arm ``kin`` (fill own slots only from kin) against its twin
``alone-i`` on held-out greedy accuracy of the final weights (400 ID, 200 OOD prompts). The seed is
the unit: a kind with two nodes counts the mean of its nodes within a seed.

* **not worse off**: the one-sided 90 % lower confidence bound of the mean over seeds of
  ID(kin) − ID(alone) (Student's t, df = n − 1) is ≥ −0.05;
* **real saving**: own tokens alone ÷ kin (Σ gen/tokens, rounds 1..R) ≥ 1.8 in every pair, and own
  CPU-seconds alone ÷ kin (Σ cpu/round_s, rounds 1..R) ≥ 1.4 as the mean over the kind's pairs;
* **H9 holds** iff every kind is not worse off and the LoRA and Gemma kinds show the real saving
  (the full-FT kind's saving is reported, not required); undecided below 6 seeds.

How the pairs are counted (registered 2026-12-07 18:05 UTC, before seed 3's twins: results.md, "H9:
seeds 1 and 2 lost their weights, and machines differ"): accuracy only from seeds whose arms have
both evals; tokens from every pair with records, ``--first-runs`` included (seeds 1 and 2's first
runs, whose weights were lost before their evals); CPU-seconds only from pairs whose two runs ran
on one boot (``boot_id`` of every start record), the first runs included, and only when such pairs
come from at least 3 seeds (else the CPU part, and a kind that needs it, is undecided).

Reported beside it: kin − any (today's default fill) on the control seeds and any − alone, ID and
OOD, with the pooled per-prompt McNemar counts; kin − alone on OOD; each kind's kin peers, their
share, own groups and saved groups over rounds, per arm; the KL by learner ← sender kind of the
samples each learner trained on (its round-R peer book: samples, mean, share above 0.05 / 0.5 / 5,
histogram), per arm; what the guard did.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments.repro.analyze import load_all, total
from experiments.repro.batches import H9_GEMMA, H9_SEEDS
from experiments.repro.h6_decide import mcnemar, pairs, token_ratio
from experiments.repro.h7_decide import guard_said, seed_table
from experiments.repro.h8_decide import _cell, kl_lines, per_seed
from experiments.repro.per_kind import t_quantile
from ftis_edge.metrics.stats import mean_se

MIN_SEEDS = H9_SEEDS         # registered: undecided below 6 seeds
LEVEL = 0.90                 # one-sided lower confidence bound of the mean difference
MARGIN = -0.05               # ... must reach this (a fixed margin, in accuracy)
TOKENS_FOLD = 1.8            # own tokens alone ÷ kin, every pair
CPU_FOLD = 1.4               # own CPU-seconds alone ÷ kin, mean over the kind's pairs
CPU_MIN_SEEDS = 3            # ... pairs on one boot, from at least this many seeds
CPU = "cpu/round_s"
# (kind, nodes, its real saving is part of the claim)
KINDS = (("SmolLM2 LoRA", (0, 1), True), ("full fine-tuning", (2,), False), ("Gemma 3 LoRA", H9_GEMMA, True))
NODE_KINDS = {i: kind for kind, nodes, _ in KINDS for i in nodes}    # node index -> kind, for the KL table
BLOCKS = ((1, 8), (9, 16), (17, 24), (25, 32))
SLOT_KEYS = (("kin/peers", "kin peers"), ("kin/share", "kin share (lowest)"), ("groups/own", "own groups"),
             ("peers/saved_groups", "saved groups"))


def lower_bound(values: list[float], level: float = LEVEL) -> float:
    """The one-sided LEVEL lower confidence bound of the mean over VALUES (t, df = n − 1); nan below 2."""
    m, se = mean_se(values)
    return float("nan") if se != se else m - t_quantile(level, len(values) - 1) * se


def cost_ratio(twin: dict, node: dict, key: str) -> float:
    """KEY summed over the rounds counted (1..R), twin ÷ node."""
    own = total([node], key)
    return total([twin], key) / own if own else float("nan")


def one_boot(a: dict, b: dict) -> bool:
    """Both runs, and every resume of each, on one boot: only then do their CPU-seconds compare
    (another VM of the same kind differed 1.3x, another kind of CPU 2x on the update)."""
    boots = {m.get("boot_id") for run in (a, b) for m in run.get("machines", [])}
    return len(boots) == 1 and None not in boots


def kind_verdict(recv: dict, nodes, saving_required: bool, first: dict | None = None) -> dict:
    """One kind's figures and its part of the rule; FIRST: runs that count for the saving only."""
    d = per_seed(recv, "kin", "alone", nodes)
    lb = lower_bound(list(d.values()))
    ps = sorted(pairs(recv, "kin", "alone", nodes) + pairs(first or {}, "kin", "alone", nodes),
                key=lambda p: (p[1], p[0]))
    folds = [token_ratio(b, a) for _, _, a, b in ps]
    booted = [(seed, cost_ratio(b, a, CPU)) for _, seed, a, b in ps if one_boot(a, b)]
    cpu = [r for _, r in booted]
    split = len(ps) - len(booted)
    cpu_mean = statistics.fmean(cpu) if cpu else float("nan")
    not_worse = lb == lb and lb >= MARGIN
    tokens_ok = bool(folds) and all(f >= TOKENS_FOLD for f in folds)
    cpu_ok = None if len({s for s, _ in booted}) < CPU_MIN_SEEDS else cpu_mean >= CPU_FOLD
    saving = cpu_ok if tokens_ok else False                        # None: tokens met, CPU undecided
    ok = saving if saving_required and not_worse else not_worse
    return {"diffs": d, "lb": lb, "folds": folds, "cpu": cpu, "cpu_split": split, "cpu_mean": cpu_mean,
            "not_worse": not_worse, "tokens_ok": tokens_ok, "cpu_ok": cpu_ok, "saving": saving, "ok": ok}


def _met(ok: bool | None) -> str:
    return "undecided" if ok is None else "met" if ok else "not met"


def _so_far(ok: bool | None) -> str:
    return "the CPU part undecided" if ok is None else "holds" if ok else "fails"


def decide(recv: dict, first: dict | None = None) -> tuple[list[str], bool | None, int]:
    """The table per kind, the verdict (None: undecided) and the seeds the thinnest kind has.
    FIRST: runs that count for the saving only (``kind_verdict``)."""
    lines = [f"| kind | seeds | Δ ID kin − alone, per seed | mean ± SE | {LEVEL:.0%} lower bound | ≥ {MARGIN:g} | "
             f"own tokens alone ÷ kin (per pair) | all ≥ {TOKENS_FOLD:g}× | "
             f"own CPU-s alone ÷ kin, mean over pairs on one boot | ≥ {CPU_FOLD:g}× | saving | kind |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts, seeds = [], []
    for kind, nodes, required in KINDS:
        v = kind_verdict(recv, nodes, required, first)
        seeds.append(len(v["diffs"]))
        verdicts.append(v["ok"])
        lb = "–" if v["lb"] != v["lb"] else f"{v['lb']:+.3f}"
        cpu = "–" if v["cpu_mean"] != v["cpu_mean"] else f"{v['cpu_mean']:.2f}"
        cpu += f" ({len(v['cpu'])} pairs" + (f"; {v['cpu_split']} split across boots, not counted)" if v["cpu_split"]
                                             else ")")
        saving = ("required" if required else "reported") + {True: ": shown", False: ": not shown",
                                                             None: ": undecided"}[v["saving"]]
        said = _so_far(v["ok"]) if len(v["diffs"]) >= MIN_SEEDS and v["ok"] is not None else \
            f"undecided (so far {_so_far(v['ok'])})"
        lines.append(
            f"| {kind} (node{'s' * (len(nodes) > 1)} {', '.join(map(str, nodes))}) | {len(v['diffs'])} | "
            f"{', '.join(f's{s} {x:+.3f}' for s, x in v['diffs'].items()) or '–'} | {_cell(v['diffs'])} | "
            f"{lb} | {_met(v['not_worse'])} | {', '.join(f'{f:.2f}' for f in v['folds']) or '–'} | "
            f"{_met(v['tokens_ok'])} | {cpu} | {_met(v['cpu_ok'])} | {saving} | {said} |")
    n = min(seeds)
    if n < MIN_SEEDS:
        return lines, None, n
    return lines, False if False in verdicts else None if None in verdicts else True, n    # one failing kind decides


def verdict_line(holds: bool | None, n: int) -> str:
    rule = (f"H9 (every kind: {LEVEL:.0%} lower bound of ID kin − alone ≥ {MARGIN:g}; LoRA and Gemma: own tokens "
            f"≥ {TOKENS_FOLD:g}× fewer in every pair and own CPU-seconds ≥ {CPU_FOLD:g}× fewer over the kind)")
    if holds is None:
        return f"{rule}: undecided: " + (f"n seeds = {n} < {MIN_SEEDS}" if n < MIN_SEEDS else
                                         f"CPU pairs on one boot from < {CPU_MIN_SEEDS} seeds")
    return f"{rule}: " + ("HOLDS" if holds else "DOES NOT HOLD")


def comparisons(recv: dict) -> list[str]:
    """Per kind: kin − any on the control seeds, any − alone and kin − alone, ID and OOD (seed = unit,
    SE over seeds), with the pooled per-prompt McNemar counts (right only in the first / the second)."""
    lines = ["| kind | comparison | seeds | Δ ID | Δ OOD | per prompt, ID (only first / only second) |",
             "|---|---|---|---|---|---|"]
    for kind, nodes, _ in KINDS:
        for arm, ref in (("kin", "any"), ("any", "alone"), ("kin", "alone")):
            d_id, d_ood = per_seed(recv, arm, ref, nodes), per_seed(recv, arm, ref, nodes, "ood")
            a_only, b_only, p = mcnemar(pairs(recv, arm, ref, nodes), "id")
            lines.append(f"| {kind} | {arm} − {ref} | {len(d_id)} | {_cell(d_id)} | {_cell(d_ood)} | "
                         f"{a_only} / {b_only}, p = {p:.2g} |")
    return lines


def block_mean(runs: list[dict], key: str, lo: int, hi: int) -> float | None:
    vals = [r[key] for run in runs for r in run["rounds"]
            if lo <= r.get("round", 0) <= hi and isinstance(r.get(key), (int, float))]
    return statistics.fmean(vals) if vals else None


def slot_lines(recv: dict, arms=("kin", "any")) -> list[str]:
    """Per kind and arm, each block of rounds: the mean over the kind's nodes and seeds of its kin
    peers (k of them may fill B·k/(k+1) own slots), their lowest share, own groups and saved groups."""
    lines = ["| kind | arm | " + " | ".join(f"rounds {lo}–{hi}" for lo, hi in BLOCKS) + " |",
             "|---|---|" + "---|" * len(BLOCKS)]
    for kind, nodes, _ in KINDS:
        for arm in arms:
            runs = [run for i in nodes for run in recv.get(f"{arm}-{i}", {}).values()]
            if not runs:
                continue
            for key, label in SLOT_KEYS:
                cells = [block_mean(runs, key, lo, hi) for lo, hi in BLOCKS]
                if all(c is None for c in cells):
                    continue
                lines.append(f"| {kind} | {arm}: {label} | " + " | ".join("–" if c is None else f"{c:.2f}"
                                                                         for c in cells) + " |")
    return lines


def guard_lines(recv: dict, arms=("kin", "any")) -> list[str]:
    """What the guard did: quiet runs counted per arm, every other run named with its levels."""
    lines = []
    for arm in arms:
        quiet, runs = 0, 0
        for kind, nodes, _ in KINDS:
            for i in nodes:
                for seed, run in sorted(recv.get(f"{arm}-{i}", {}).items()):
                    runs += 1
                    said = guard_said(run["rounds"])
                    if said == "quiet":
                        quiet += 1
                    else:
                        lines.append(f"* {arm}-{i} ({kind}) s{seed}: guard {said}")
        if runs:
            lines.append(f"* arm {arm}: guard quiet in {quiet} of {runs} runs")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="run.py's --out, or docs/runs/h9")
    ap.add_argument("--batch", default="h9")
    ap.add_argument("--seed", type=int, help="print only this seed's runs, as results.md tabulates them")
    ap.add_argument("--first-runs", type=Path, help="runs that count for the saving only (docs/runs/h9-first: "
                    "seeds 1 and 2's first runs, whose weights were lost before their evals)")
    args = ap.parse_args()
    recv = load_all(args.runs).get(args.batch, {})
    first = load_all(args.first_runs).get(args.batch, {}) if args.first_runs else None
    if args.seed is not None:
        print("\n".join(seed_table(recv, args.seed)))
        return 0
    lines, holds, n = decide(recv, first)
    print("\n".join(lines))
    print(verdict_line(holds, n))
    for title, part in (("Beside the claim: each arm per kind (seed = unit, SE over seeds)", comparisons(recv)),
                        ("Kin slots over rounds (means over the kind's nodes and seeds)", slot_lines(recv)),
                        ("KL by learner ← sender kind, arm kin (samples trained on, all seeds)",
                         kl_lines(recv, "kin", NODE_KINDS)),
                        ("KL by learner ← sender kind, arm any (control seeds)", kl_lines(recv, "any", NODE_KINDS)),
                        ("The guard", guard_lines(recv))):
        print(f"\n{title}\n" + "\n".join(part))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
