"""Does joining help, per kind of node: an arm against its twins alone over one or more batches'
seeds (issue 65.8: the README's table from the default arm's pooled seeds, H6 + H7).

    .venv/bin/python -m experiments.repro.per_kind --runs docs/runs/h6 docs/runs/h7
    .venv/bin/python -m experiments.repro.per_kind --runs docs/runs/h8 --batches h8

Per kind and batch, then pooled: held-out ID accuracy (final weights, greedy) arm − alone with
the **seed as the unit** (a kind with two nodes a seed counts their mean once), mean ± SE, its
95 % interval over seeds (what "level" may claim), how many seeds were negative, the two-sided t-test p over seeds; beside it the pooled per-prompt
exact McNemar (h6_decide.mcnemar: right as the accuracy counts it) and own tokens alone ÷ arm
per pair. Then how much of its batch each node of the worth arm generated itself (H7).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments.repro.analyze import load_all, total
from experiments.repro.h6_decide import _acc, mcnemar, pairs, token_ratio
from ftis_edge.metrics.stats import mean_se, t_sf, t_test_greater

H6_KINDS = (("same-model LoRA", (0, 1)), ("full fine-tuning", (2,)), ("other tokenizer (Gemma 3)", (3,)))
KINDS = {"h6": H6_KINDS, "h7": H6_KINDS,
         "h8": (("base beside experts", (0, 1)), ("expert beside base nodes", (2, 3)))}
LEVEL = 0.95                 # the interval beside the mean: "level" only where it is narrow


def seed_diffs(ps, which: str = "id") -> list[float]:
    """arm − alone per seed (PS from h6_decide.pairs, seeds made unique across batches), the
    kind's nodes averaged within a seed."""
    by: dict = {}
    for _, seed, a, b in ps:
        x, y = _acc(a, which), _acc(b, which)
        if x is not None and y is not None:
            by.setdefault(seed, []).append(x - y)
    return [statistics.fmean(v) for _, v in sorted(by.items())]


def p_two_sided(values: list[float]) -> float:
    t, p = t_test_greater(values)
    return p if p != p else min(1.0, 2 * min(p, 1 - p))


def t_quantile(q: float, df: int) -> float:
    """t with P(T <= t) = Q for Student's t (bisection on stats.t_sf; Q in (0.5, 1))."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - t_sf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def interval(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """The two-sided LEVEL confidence interval of the mean over VALUES (the seeds)."""
    m, se = mean_se(values)
    if se != se:
        return float("nan"), float("nan")
    half = t_quantile((1 + level) / 2, len(values) - 1) * se
    return m - half, m + half


def kind_pairs(batches: dict[str, dict], arm: str, nodes) -> list:
    """The pairs of every batch, each seed keyed (batch, seed) so that seeds of two batches stay apart."""
    return [(i, (name, seed), a, b) for name, recv in batches.items()
            for i, seed, a, b in pairs(recv, arm, "alone", nodes)]


def row(label: str, ps) -> str:
    d = seed_diffs(ps)
    if not d:
        return f"| {label} | 0 | – | – | – | – | – | – |"
    m, se = mean_se(d)
    lo, hi = interval(d)
    a_only, b_only, p_mc = mcnemar(ps, "id")
    folds = [token_ratio(b, a) for _, _, a, b in ps]
    spread = f"{statistics.fmean(folds):.1f}× ({min(folds):.1f}–{max(folds):.1f})"
    return (f"| {label} | {len(d)} | {100 * m:+.1f} ± {'–' if se != se else f'{100 * se:.1f}'} | "
            f"{'–' if lo != lo else f'{100 * lo:+.1f} to {100 * hi:+.1f}'} | {sum(x < 0 for x in d)} of {len(d)} | {p_two_sided(d):.2g} | {a_only} / {b_only}, p = {p_mc:.2g} | {spread} |")


def table(batches: dict[str, dict], arm: str) -> list[str]:
    lines = [f"| kind, batch | seeds | ID {arm} − alone, points (± SE over seeds) | {LEVEL:.0%} interval | seeds below alone | "
             f"t over seeds, p (two-sided) | per prompt: right only in {arm} / only alone | own tokens alone ÷ {arm} |",
             "|---|---|---|---|---|---|---|---|"]
    for kinds in dict.fromkeys(KINDS[name] for name in batches):       # batches of one design pool
        alike = {name: recv for name, recv in batches.items() if KINDS[name] == kinds}
        for kind, nodes in kinds:
            for name, recv in alike.items():
                lines.append(row(f"{kind}, {name}", kind_pairs({name: recv}, arm, nodes)))
            if len(alike) > 1:
                lines.append(row(f"{kind}, **pooled**", kind_pairs(alike, arm, nodes)))
    return lines


def own_share(run: dict) -> float | None:
    """Own groups ÷ the groups the node trained on (own + peers' used), over its scored rounds."""
    own, used = total([run], "groups/own"), total([run], "peers/groups_used")
    return own / (own + used) if own + used else None


def own_shares(recv: dict, arm: str) -> list[str]:
    lines = []
    for name in sorted(n for n in recv if n.startswith(f"{arm}-")):
        shares = [own_share(run) for _, run in sorted(recv[name].items())]
        lines.append(f"* {name}: generated " + ", ".join("–" if s is None else f"{s:.0%}" for s in shares)
                     + " of its batch itself (per seed)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="published batches, e.g. docs/runs/h6 docs/runs/h7")
    ap.add_argument("--arm", default="ftis", help="the arm against its twins (default: ftis, the default F-TIS)")
    ap.add_argument("--worth", default="worth", help="the arm whose own share is reported (H7's fill by worth)")
    ap.add_argument("--batches", nargs="+", default=["h6", "h7"], choices=sorted(KINDS),
                    help="batches to read (H6 and H7 share their kinds of node and pool; H8 has its own)")
    args = ap.parse_args()
    batches = {name: recv for runs in args.runs for name, recv in load_all(runs).items()
               if name in args.batches and any(n.startswith(f"{args.arm}-") for n in recv)}
    if not batches:
        raise SystemExit(f"no batch with an arm {args.arm!r} under {', '.join(map(str, args.runs))}")
    print("\n".join(table(batches, args.arm)))
    for name, recv in batches.items():
        if any(n.startswith(f"{args.worth}-") for n in recv):
            print(f"\n{name}, arm {args.worth} against alone:\n")
            print("\n".join(table({name: recv}, args.worth)))
            print()
            print("\n".join(own_shares(recv, args.worth)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
