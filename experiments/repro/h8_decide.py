"""H8's pre-registered decision (docs/results.md, "H8, as registered"), per kind of node.

    .venv/bin/python -m experiments.repro.h8_decide --runs docs/runs/h8

Kinds: **base** (nodes 0 and 1, SmolLM2-135M) and **expert** (nodes 2 and 3, started from the
arith-level-6 expert: same tokenizer, another base model). For each kind, node i of arm ``ftis``
against its twin ``alone-i`` (same node id and seed) on held-out greedy accuracy of the final
weights (200 ID and 200 OOD prompts): per seed the kind's mean difference over its two nodes, then
mean ± SE over seeds (the seeds are the independent units; the two nodes of a seed share a swarm).
The claim holds for a kind when mean Δ ID ≥ −2 SE and every pair generated ≥ 3× fewer own tokens
(Σ gen/tokens, alone ÷ ftis); H8 holds when it holds for both kinds. No decision on fewer than 3
seeds.

Reported beside it, each with its SE over seeds: ftis − nois and nois − alone per kind (ID, OOD),
ftis − alone on OOD (the paper's +5–12 %), pooled per-prompt McNemar counts; the per-sample KL of
each kind's samples at each kind of learner (the peers' ``kl_hist``: its distribution and the share
above each g); the g sweep (arms g0.05 and g0.5 against arm ftis, g = 5, on the seeds they ran);
what the guard did, by level.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.repro.analyze import load_all, total
from experiments.repro.h6_decide import _acc, mcnemar, pairs, token_ratio
from experiments.repro.h7_decide import _signed, guard_said
from ftis_edge.metrics.stats import mean_se

MIN_SEEDS = 3                # registered: no decision on fewer
TOKENS_FOLD = 3.0            # own tokens alone ÷ ftis, every pair
KINDS = (("base", (0, 1)), ("expert", (2, 3)))
NODE_KINDS = {i: kind for kind, nodes in KINDS for i in nodes}      # node index -> kind, for kl_by_kind
SWEEP = (("g0.05", 0.05), ("g0.5", 0.5), ("ftis", 5.0))


def kind_of(node: int) -> str:
    return next(kind for kind, nodes in KINDS if node in nodes)


def per_seed(recv: dict, arm: str, ref: str, nodes, which: str = "id") -> dict[int, float]:
    """{seed: the mean over NODES of acc(arm-i) − acc(ref-i)}, seeds where every node has both evals."""
    by_seed: dict[int, list[float]] = {}
    for i, seed, a, b in pairs(recv, arm, ref, nodes):
        x, y = _acc(a, which), _acc(b, which)
        by_seed.setdefault(seed, []).append(float("nan") if x is None or y is None else x - y)
    return {s: sum(d) / len(d) for s, d in sorted(by_seed.items())
            if len(d) == len(nodes) and all(v == v for v in d)}


def _cell(d: dict[int, float]) -> str:
    return _signed(*mean_se(d.values()))


def claim(recv: dict) -> tuple[list[str], bool | None]:
    """The registered rule per kind; None (undecided) below MIN_SEEDS seeds in either kind."""
    lines = [f"| kind | seeds | Δ ID ftis − alone, per seed | mean ± SE | ≥ −2 SE | own tokens alone ÷ ftis "
             f"(per pair) | all ≥ {TOKENS_FOLD:g}× | holds |", "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for kind, nodes in KINDS:
        d = per_seed(recv, "ftis", "alone", nodes)
        m, se = mean_se(d.values())
        id_ok = m == m and m >= -2 * (0.0 if se != se else se)
        folds = [token_ratio(b, a) for _, _, a, b in sorted(pairs(recv, "ftis", "alone", nodes), key=lambda p: p[:2])]
        tok_ok = bool(folds) and all(f >= TOKENS_FOLD for f in folds)
        decided = len(d) >= MIN_SEEDS
        verdicts.append((id_ok and tok_ok) if decided else None)
        lines.append(f"| {kind} | {len(d)} | {', '.join(f's{s} {v:+.3f}' for s, v in d.items()) or '–'} | "
                     f"{_cell(d)} | {'met' if id_ok else 'not met'} | {', '.join(f'{f:.2f}' for f in folds) or '–'} | "
                     f"{'met' if tok_ok else 'not met'} | "
                     f"{'undecided' if not decided else 'yes' if verdicts[-1] else 'no'} |")
    if any(v is None for v in verdicts):
        return lines, None
    return lines, all(verdicts)


def verdict_line(holds: bool | None) -> str:
    if holds is None:
        return f"claim (each kind: ID ≥ alone − 2 SE with ≥ {TOKENS_FOLD:g}× fewer own tokens): " \
               f"undecided: fewer than {MIN_SEEDS} seeds"
    return "claim (each kind: ID ≥ alone − 2 SE with ≥ 3× fewer own tokens): " + ("HOLDS" if holds else "DOES NOT HOLD")


def comparisons(recv: dict) -> list[str]:
    """Per kind: each arm against alone and ftis against nois, ID and OOD, SE over seeds, with the
    pooled per-prompt McNemar counts (right only in the first / only in the second) beside them."""
    lines = ["| kind | comparison | seeds | Δ ID | Δ OOD | per prompt, ID (only first / only second) |",
             "|---|---|---|---|---|---|"]
    for kind, nodes in KINDS:
        for arm, ref in (("ftis", "alone"), ("nois", "alone"), ("ftis", "nois")):
            d_id, d_ood = per_seed(recv, arm, ref, nodes), per_seed(recv, arm, ref, nodes, "ood")
            a_only, b_only, p = mcnemar(pairs(recv, arm, ref, nodes), "id")
            lines.append(f"| {kind} | {arm} − {ref} | {len(d_id)} | {_cell(d_id)} | {_cell(d_ood)} | "
                         f"{a_only} / {b_only}, p = {p:.2g} |")
    return lines


def node_lines(recv: dict, arms=("ftis", "nois", "alone")) -> list[str]:
    """One row per node and seed: each arm's final ID / OOD accuracy and its own tokens (thousands)."""
    lines = [f"| seed | node | {' | '.join(f'{a} ID / OOD' for a in arms)} | own tokens (k) {' / '.join(arms)} |",
             "|---|---|" + "---|" * (len(arms) + 1)]
    seeds = sorted({s for a in arms for i in range(4) for s in recv.get(f"{a}-{i}", {})})
    fmt = lambda x: "–" if x is None else f"{x:.3f}"   # noqa: E731
    for seed in seeds:
        for i in range(4):
            runs = [recv.get(f"{a}-{i}", {}).get(seed) for a in arms]
            accs = ["–" if r is None else f"{fmt(_acc(r, 'id'))} / {fmt(_acc(r, 'ood'))}" for r in runs]
            toks = ["–" if r is None else f"{total([r], 'gen/tokens') / 1000:.1f}" for r in runs]
            lines.append(f"| s{seed} | {i} {kind_of(i)} | {' | '.join(accs)} | {' / '.join(toks)} |")
    return lines


def kl_by_kind(recv: dict, arm: str, kinds: dict[int, str] = NODE_KINDS) -> dict[tuple[str, str], dict]:
    """{(learner kind, sender kind): {"edges", "counts", "kl_sum", "samples"}} summed over seeds and
    nodes of ARM, from each run's last round's cumulative peer book (``peers.*.kl_hist``); KINDS maps
    a node index to its kind (a learner or sender outside it, e.g. an attacker's id, is left out)."""
    out: dict[tuple[str, str], dict] = {}
    for name, seeds in recv.items():
        a, _, i = name.rpartition("-")
        if a != arm or not i.isdigit() or int(i) not in kinds:
            continue
        for run in seeds.values():
            book = next((r["peers"] for r in reversed(run["rounds"]) if r.get("peers")), {})
            for peer, p in book.items():
                sender = peer.rpartition("-")[2]
                if not sender.isdigit() or int(sender) not in kinds:
                    continue
                cell = out.setdefault((kinds[int(i)], kinds[int(sender)]),
                                      {"edges": None, "counts": None, "kl_sum": 0.0, "samples": 0})
                n = p.get("samples_used") or 0
                cell["samples"] += n
                cell["kl_sum"] += (p.get("kl_mean") or 0.0) * n
                hist = p.get("kl_hist")
                if hist:
                    if cell["counts"] is None:
                        cell["edges"], cell["counts"] = list(hist["edges"]), [0] * len(hist["counts"])
                    cell["counts"] = [c + x for c, x in zip(cell["counts"], hist["counts"])]
    return out


def share_above(cell: dict, g: float) -> float | None:
    """Share of the cell's scored samples with KL > g, from its histogram (bins [e_k, e_k+1) whose
    lower edge is ≥ g; g must be an edge). None without a histogram."""
    if not cell.get("counts"):
        return None
    n = sum(cell["counts"])
    if g not in cell["edges"]:
        raise ValueError(f"g = {g} is not a kl_hist edge ({cell['edges']})")
    k = cell["edges"].index(g)
    return sum(cell["counts"][k:]) / n if n else None


def kl_lines(recv: dict, arm: str = "ftis", kinds: dict[int, str] = NODE_KINDS) -> list[str]:
    """One row per learner kind ← sender kind of ARM (kinds in node order), from ``kl_by_kind``; a
    pair whose samples were never trained on (e.g. another tokenizer's text, not trained) shows –."""
    lines = [f"| arm {arm}: learner ← sender | samples | mean KL | KL > 0.05 | KL > 0.5 | KL > 5 | histogram "
             "(counts per bin) |", "|---|---|---|---|---|---|---|"]
    order = list(dict.fromkeys(kinds[i] for i in sorted(kinds)))
    for (learner, sender), cell in sorted(kl_by_kind(recv, arm, kinds).items(),
                                          key=lambda kv: (order.index(kv[0][0]), order.index(kv[0][1]))):
        mean = f"{cell['kl_sum'] / cell['samples']:.2g}" if cell["samples"] else "–"
        shares = [share_above(cell, g) for g, _ in ((0.05, 0), (0.5, 0), (5.0, 0))]
        hist = ("" if not cell["counts"] else
                ", ".join(f"[{lo:g}, {hi:g}): {c}" for lo, hi, c in zip(cell["edges"], cell["edges"][1:] + [float("inf")], cell["counts"]) if c))
        lines.append(f"| {learner} ← {sender} | {cell['samples']:,} | {mean} | "
                     + " | ".join("–" if s is None else f"{s:.1%}" for s in shares) + f" | {hist or '–'} |")
    return lines


def sweep_lines(recv: dict) -> list[str]:
    """The g sweep: each arm's ID and OOD per kind on the seeds every sweep arm ran, and the share of
    all samples scored (own and peers') the filter dropped: Σ filter/dropped ÷ Σ (dropped + kept)."""
    seeds = sorted(set.intersection(*[{s for n, ss in recv.items() if n.startswith(f"{arm}-") for s in ss}
                                      for arm, _ in SWEEP]))
    lines = ["| arm | g | seeds | ID base | ID expert | OOD base | OOD expert | filter dropped (of all samples) |",
             "|---|---|---|---|---|---|---|---|"]
    if not seeds:
        return lines + ["| – | – | 0 | – | – | – | – | – |"]
    for arm, g in SWEEP:
        cells = []
        for which in ("id", "ood"):
            for _, nodes in KINDS:
                accs = [_acc(recv[f"{arm}-{i}"][s], which) for i in nodes for s in seeds
                        if s in recv.get(f"{arm}-{i}", {})]
                accs = [a for a in accs if a is not None]
                cells.append(f"{sum(accs) / len(accs):.3f}" if accs else "–")
        rounds = [r for i in range(4) for s in seeds for r in recv.get(f"{arm}-{i}", {}).get(s, {"rounds": []})["rounds"]]
        dropped, kept = (sum(r.get(k) or 0 for r in rounds) for k in ("filter/dropped", "filter/kept"))
        share = f"{dropped / (dropped + kept):.1%}" if dropped + kept else "–"
        lines.append(f"| {arm} | {g:g} | {len(seeds)} | " + " | ".join(cells) + f" | {share} |")
    return lines


def guard_lines(recv: dict) -> list[str]:
    lines = []
    for arm in ("ftis", "nois", "g0.05", "g0.5"):
        for i in range(4):
            for seed, run in sorted(recv.get(f"{arm}-{i}", {}).items()):
                lines.append(f"* {arm}-{i} ({kind_of(i)}) s{seed}: guard {guard_said(run['rounds'])}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="run.py's --out, or docs/runs/h8")
    ap.add_argument("--batch", default="h8")
    args = ap.parse_args()
    recv = load_all(args.runs).get(args.batch, {})
    lines, holds = claim(recv)
    print("\n".join(lines))
    print(verdict_line(holds))
    for title, part in (("Each node (final weights, 200 + 200 greedy prompts)", node_lines(recv)),
                        ("Each arm per kind (SE over seeds)", comparisons(recv)),
                        ("Per-sample KL, arm ftis", kl_lines(recv, "ftis")),
                        ("Per-sample KL, arm nois", kl_lines(recv, "nois")),
                        ("The g sweep", sweep_lines(recv)),
                        ("The guard", guard_lines(recv))):
        print(f"\n{title}\n" + "\n".join(part))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
