"""H6's pre-registered decision (docs/results.md, "H6, pre-registered"), per kind of node.

    .venv/bin/python -m experiments.repro.h6_decide --runs docs/runs/h6
    .venv/bin/python -m experiments.repro.h6_decide --runs docs/runs/fill --batch fill-hetero --arm ftis --control nois

For each kind of node (same-model LoRA = nodes 0 and 1, full fine-tuning = node 2, other
tokenizer = node 3), over every seed: node i of ``--arm`` minus its twin alone-i (same node id
and seed) on held-out greedy accuracy of the final weights (ID and OOD, 200 prompts each), mean
± SE over the pairs; own tokens generated over the run, twin ÷ node, per pair. The claim holds
for a kind when ID ≥ twin − 2 SE (the other-tokenizer kind also within 5 points: ≥ −0.05) and
every pair generated ≥ 3× fewer own tokens; it holds when it holds for every kind. Then
``--arm`` minus ``--control`` node by node (the protections' own effect), reported.

Two readings of the compute part registered after seeing seeds 0 and 1 (before seed 2) are
reported beside the decision, not in it: each kind's *mean* token ratio over its pairs, and the
ratio over only the rounds in which all of the arm's nodes were still running (a node's round
counts when it ended before the arm's first node stopped; the twin's same rounds by number).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.repro.analyze import load_all, total
from ftis_edge.metrics.stats import mcnemar_two_sided, mean_se

KINDS = (("same-model LoRA", (0, 1)), ("full fine-tuning", (2,)), ("other tokenizer", (3,)))
TOKENS_FOLD = 3.0            # each node generates >= 3x fewer own tokens than alone
GEMMA_MARGIN = 0.05          # the other-tokenizer node: within 5 points of alone or better


def _acc(run: dict, which: str) -> float | None:
    e = run["evals"].get(which)
    return None if e is None else float(e["accuracy"])


def pairs(recv: dict, arm: str, ref: str, nodes) -> list[tuple[int, int, dict, dict]]:
    out = []
    for i in nodes:
        for seed, a in recv.get(f"{arm}-{i}", {}).items():
            b = recv.get(f"{ref}-{i}", {}).get(seed)
            if b is not None:
                out.append((i, seed, a, b))
    return out


def right(item: dict) -> bool:
    """An eval item as its eval's accuracy counts it (evaluate.summarize: reward >= 1)."""
    return item["reward"] >= 1.0


def mcnemar(ps, which: str) -> tuple[int, int, float]:
    """Prompts node a answered right and b wrong, the reverse, and the exact two-sided McNemar p,
    pooled over the pairs (each pair scored the same prompts): a per-prompt view of a difference
    whose SE over a few pairs is itself uncertain. "Right" is what the accuracy counts (reward 1:
    answer and format), not the item's "correct" (answer alone), so the counts add up to the
    accuracies' difference."""
    a_only = b_only = 0
    for _, _, a, b in ps:
        ea, eb = a["evals"].get(which), b["evals"].get(which)
        if ea is None or eb is None:
            continue
        right_b = {item["id"]: right(item) for item in eb["items"]}
        for item in ea["items"]:
            if item["id"] in right_b and right(item) != right_b[item["id"]]:
                a_only += right(item)
                b_only += right_b[item["id"]]
    return a_only, b_only, mcnemar_two_sided(a_only, b_only)


def _mc(ps, which: str) -> str:
    a_only, b_only, p = mcnemar(ps, which)
    return f"{a_only} / {b_only}, p = {p:.2g}"


def _fmt(m: float, se: float) -> str:
    return "–" if m != m else f"{m:+.3f} ± {se:.3f}"


def shared_rounds(recv: dict, arm: str, seed: int, node: int) -> int:
    """How many of node NODE's rounds ended while every node of ARM (seed SEED) was still running:
    before the first of them wrote its stop record. All its rounds when a stop time is missing."""
    runs = [seeds[seed] for name, seeds in recv.items() if name.startswith(f"{arm}-") and seed in seeds]
    stops = [r["stopped"] for r in runs if r.get("stopped") is not None]
    rounds = recv[f"{arm}-{node}"][seed]["rounds"]
    if not stops:
        return len(rounds)
    first_stop = min(stops)
    return sum(1 for r in rounds if r.get("time", float("inf")) <= first_stop)


def token_ratio(twin: dict, node: dict, k: int | None = None) -> float:
    """Own tokens, twin ÷ node, over the first K rounds of each (all rounds when K is None)."""
    own = lambda run: sum(r.get("gen/tokens") or 0 for r in run["rounds"][:k])   # noqa: E731
    return own(twin) / own(node) if own(node) else float("nan")


def compute_readings(data: dict, batch: str, arm: str) -> list[str]:
    """The two compute readings registered after seeds 0 and 1 (docs/results.md), per kind."""
    recv = data.get(batch, {})
    lines = [f"| kind | pairs | alone ÷ {arm}, mean over pairs | mean ≥ {TOKENS_FOLD:g} | rounds with all "
             f"nodes running (per pair) | alone ÷ {arm} over those rounds (per pair) | their mean | mean ≥ {TOKENS_FOLD:g} |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, nodes in KINDS:
        ps = pairs(recv, arm, "alone", nodes)
        if not ps:
            continue
        whole = [token_ratio(b, a) for _, _, a, b in ps]
        ks = [shared_rounds(recv, arm, seed, i) for i, seed, _, _ in ps]
        window = [token_ratio(b, a, k) for (_, _, a, b), k in zip(ps, ks)]
        m_whole, m_window = sum(whole) / len(whole), sum(window) / len(window)
        lines.append(f"| {kind} | {len(ps)} | {m_whole:.2f} | {'met' if m_whole >= TOKENS_FOLD else 'not met'} | "
                     f"{', '.join(map(str, ks))} | {', '.join(f'{w:.2f}' for w in window)} | {m_window:.2f} | "
                     f"{'met' if m_window >= TOKENS_FOLD else 'not met'} |")
    return lines


def decide(data: dict, batch: str, arm: str, control: str) -> tuple[list[str], bool | None]:
    recv = data.get(batch, {})
    lines = [f"| kind | pairs | Δ ID ({arm} − alone) | Δ OOD | ID rule | own tokens alone ÷ {arm} (per pair) | "
             f"tokens rule | holds | ID prompts right only in {arm} / only alone |", "|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for kind, nodes in KINDS:
        ps = pairs(recv, arm, "alone", nodes)
        if not ps:
            lines.append(f"| {kind} | 0 | – | – | – | – | – | not run | – |")
            verdicts.append(None)
            continue
        d = {w: [(_acc(a, w), _acc(b, w)) for _, _, a, b in ps] for w in ("id", "ood")}
        d = {w: [x - y for x, y in v if x is not None and y is not None] for w, v in d.items()}
        (m_id, se_id), (m_ood, se_ood) = mean_se(d["id"]), mean_se(d["ood"])
        se = 0.0 if se_id != se_id else se_id       # one pair has no SE: then the point estimate must be >= 0
        id_ok = len(d["id"]) == len(ps) and m_id >= -2 * se and (nodes != (3,) or m_id >= -GEMMA_MARGIN)
        folds = [token_ratio(b, a) for _, _, a, b in ps]
        tok_ok = all(f >= TOKENS_FOLD for f in folds)
        verdicts.append(id_ok and tok_ok)
        lines.append(f"| {kind} | {len(ps)} | {_fmt(m_id, se_id)} | {_fmt(m_ood, se_ood)} | "
                     f"{'met' if id_ok else 'not met'} | {', '.join(f'{f:.2f}' for f in folds)} | "
                     f"{'met' if tok_ok else 'not met'} | {'**yes**' if id_ok and tok_ok else '**no**'} | "
                     f"{_mc(ps, 'id')} |")
    lines += ["", f"| node | pairs | Δ ID ({arm} − {control}) | Δ OOD | own tokens {arm} ÷ {control} | "
                  f"ID prompts right only in {arm} / only {control} |", "|---|---|---|---|---|---|"]
    for kind, nodes in KINDS:
        for i in nodes:
            ps = pairs(recv, arm, control, (i,))
            if not ps:
                continue
            d = {w: [_acc(a, w) - _acc(b, w) for _, _, a, b in ps if _acc(a, w) is not None and _acc(b, w) is not None]
                 for w in ("id", "ood")}
            ratio = total([a for _, _, a, _ in ps], "gen/tokens") / total([b for _, _, _, b in ps], "gen/tokens")
            lines.append(f"| {i}: {kind} | {len(ps)} | {_fmt(*mean_se(d['id']))} | {_fmt(*mean_se(d['ood']))} | "
                         f"{ratio:.2f} | {_mc(ps, 'id')} |")
    done = [v for v in verdicts if v is not None]
    holds = None if len(done) < len(verdicts) else all(done)
    return lines, holds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--batch", default="h6")
    ap.add_argument("--arm", default="protect")
    ap.add_argument("--control", default="ftis")
    args = ap.parse_args()
    data = load_all(args.runs)
    lines, holds = decide(data, args.batch, args.arm, args.control)
    print("\n".join(lines))
    print(f"\nclaim (every kind no worse off while generating >= {TOKENS_FOLD:g}x fewer own tokens): "
          + {True: "HOLDS", False: "DOES NOT HOLD", None: "undecided (a kind has no pair)"}[holds])
    print("\nThe compute part read two more ways (registered after seeds 0 and 1, reported, not decided on):\n")
    print("\n".join(compute_readings(data, args.batch, args.arm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
