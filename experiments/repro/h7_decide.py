"""H7's pre-registered decision (docs/results.md, "H7, as registered"), and its secondaries.

    .venv/bin/python -m experiments.repro.h7_decide --runs docs/runs/h7

Primary, the Gemma node (node 3) within seed: D = ID(worth-3) − ID(ftis-3), held-out greedy
accuracy of the final weights on the 200 ID prompts. The claim holds when mean D > 2 SE (SE = SD
of D over seeds / √n); no decision on fewer than 5 seeds. Beside it: the one-sided t-test p over
seeds and the pooled per-prompt exact McNemar (prompts right only in worth / only in ftis).

Secondaries, each with its between-seed SE: worth-3 − alone-3 (goal: mean ≥ −0.05); own tokens
alone-3 ÷ worth-3 (Σ gen/tokens, goal ≥ 1.4×); worth-3 and ftis-3 against alone1-3 (one group a
round: equal own tokens with ftis-3, not with worth-3, which made ~3× as many); each same-model
kind (nodes 0 and 1 LoRA; node 2 full fine-tuning) ID(worth) ≥ ID(alone) − 2 SE with own tokens
alone ÷ worth ≥ 3× in every pair; per arm the share of own groups that carry a signal and ID
accuracy per 10k own tokens; which kinds of peer filled, round by
round, and what the guard did.

Nodes 0–2 of the swarm arms ran on past R until node 3 stopped and were scored on their round-R
checkpoint: their records count rounds 1..R (analyze.load_run, runon.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.repro.analyze import load_all, total
from experiments.repro.h6_decide import _acc, _fmt, mcnemar, pairs, token_ratio
from ftis_edge.metrics.stats import mean_se, t_test_greater

MIN_SEEDS = 5                # registered: no decision on fewer
GEMMA = 3                    # the node whose model differs
WITHIN = 0.05                # worth-3 within 5 points of alone-3
TOKENS_GEMMA = 1.4           # own tokens alone-3 ÷ worth-3
TOKENS_SAME = 3.0            # own tokens alone-i ÷ worth-i, same-model nodes
KINDS = (("same-model LoRA", (0, 1)), ("full fine-tuning", (2,)))
WORTH_KINDS = ("same_model", "same_tokenizer", "other_tokenizer")


def diffs(ps, which: str = "id") -> list[float]:
    """a − b accuracy per pair (pairs whose both evals exist)."""
    out = []
    for _, _, a, b in ps:
        x, y = _acc(a, which), _acc(b, which)
        if x is not None and y is not None:
            out.append(x - y)
    return out


def primary(recv: dict) -> tuple[list[str], bool | None]:
    """The registered claim on node 3; None (undecided) below MIN_SEEDS seeds."""
    ps = sorted(pairs(recv, "worth", "ftis", (GEMMA,)), key=lambda p: p[1])
    d = diffs(ps)
    n = len(d)
    m, se = mean_se(d)
    t, p = t_test_greater(d)
    a_only, b_only, p_mc = mcnemar(ps, "id")
    seeds = ", ".join(f"s{seed} {x:+.3f}" for (_, seed, _, _), x in zip(ps, d)) or "–"
    lines = [f"Primary: D = ID(worth-{GEMMA}) − ID(ftis-{GEMMA}) per seed: {seeds}",
             f"  n = {n} seeds, mean D {_signed(m, se)} (SE over seeds), 2 SE = "
             + ("–" if se != se else f"{2 * se:.3f}"),
             "  one-sided t-test over seeds: " + ("–" if p != p else f"t = {t:.2f}, p = {p:.2g}"),
             f"  pooled per-prompt exact McNemar: right only in worth / only in ftis = {a_only} / {b_only}, "
             f"p = {p_mc:.2g}"]
    if n < MIN_SEEDS:
        return lines, None
    return lines, bool(m > 2 * se)


def verdict_line(holds: bool | None, n: int) -> str:
    if holds is None:
        return f"claim (mean D > 2 SE): undecided: n seeds = {n} < {MIN_SEEDS}"
    return "claim (mean D > 2 SE): " + ("HOLDS" if holds else "DOES NOT HOLD")


def _signed(m: float, se: float) -> str:
    """+m ± SE; +m alone when one value has no SE; – for none."""
    return f"{m:+.3f}" if m == m and se != se else _fmt(m, se)


def _row(label: str, ps, goal: str = "") -> str:
    d_id, d_ood = diffs(ps, "id"), diffs(ps, "ood")
    return f"| {label} | {len(d_id)} | {_signed(*mean_se(d_id))} | {_signed(*mean_se(d_ood))} | {goal} |"


def gemma_secondaries(recv: dict) -> list[str]:
    lines = ["| node 3 (Gemma) | seeds | Δ ID | Δ OOD | goal |", "|---|---|---|---|---|"]
    ps = pairs(recv, "worth", "alone", (GEMMA,))
    m = mean_se(diffs(ps))[0]
    lines.append(_row("worth − alone", ps, "–" if m != m else
                      f"mean ≥ −{WITHIN:g}: {'met' if m >= -WITHIN else 'not met'}"))
    for arm in ("worth", "ftis"):
        # "equal own tokens" only where they are: ftis-3 generated about alone1-3's, worth-3 about 3x it
        ps = pairs(recv, arm, "alone1", (GEMMA,))
        own = total([b for _, _, _, b in ps], "gen/tokens") / (total([a for _, _, a, _ in ps], "gen/tokens") or 1)
        lines.append(_row(f"{arm} − alone1 (alone1 made {own:.2f}× {arm}'s own tokens)", ps))
    lines += ["", "| own tokens (Σ gen/tokens) | seeds | per seed | mean ± SE | goal |", "|---|---|---|---|---|"]
    for ref, arm, goal in (("alone", "worth", TOKENS_GEMMA), ("alone", "ftis", None),
                           ("alone1", "worth", None), ("alone1", "ftis", None)):
        ps = sorted(pairs(recv, arm, ref, (GEMMA,)), key=lambda p: p[1])
        ratios = [token_ratio(b, a) for _, _, a, b in ps]
        m, se = mean_se(ratios)
        met = "" if goal is None or m != m else f"≥ {goal:g}×: {'met' if m >= goal else 'not met'}"
        lines.append(f"| {ref}-3 ÷ {arm}-3 | {len(ps)} | {', '.join(f'{r:.2f}' for r in ratios) or '–'} | "
                     f"{'–' if m != m else f'{m:.2f} ± {se:.2f}' if se == se else f'{m:.2f}'} | {met} |")
    return lines


def same_model_secondaries(recv: dict) -> list[str]:
    lines = [f"| kind | pairs | Δ ID (worth − alone) | Δ OOD | ID ≥ alone − 2 SE | own tokens alone ÷ worth "
             f"(per pair) | all ≥ {TOKENS_SAME:g}× |", "|---|---|---|---|---|---|---|"]
    for kind, nodes in KINDS:
        ps = pairs(recv, "worth", "alone", nodes)
        if not ps:
            lines.append(f"| {kind} | 0 | – | – | – | – | – |")
            continue
        (m, se), ood = mean_se(diffs(ps)), mean_se(diffs(ps, "ood"))
        id_ok = m >= -2 * (0.0 if se != se else se)
        folds = [token_ratio(b, a) for _, _, a, b in ps]
        lines.append(f"| {kind} | {len(ps)} | {_signed(m, se)} | {_signed(*ood)} | {'met' if id_ok else 'not met'} | "
                     f"{', '.join(f'{f:.2f}' for f in folds)} | "
                     f"{'met' if all(f >= TOKENS_SAME for f in folds) else 'not met'} |")
    return lines


def signal_share(run: dict) -> float | None:
    """Share of the run's own groups that carried a signal (rewards that differ), over its rounds."""
    own = [(r.get("groups/own") or 0, r.get("groups/own_signal_frac")) for r in run["rounds"]]
    n = sum(g for g, f in own if f is not None)
    return sum(g * f for g, f in own if f is not None) / n if n else None


def id_per_10k(run: dict) -> float | None:
    tokens = total([run], "gen/tokens")
    acc = _acc(run, "id")
    return None if acc is None or not tokens else acc / (tokens / 1e4)


def _level(values) -> str:
    """mean ± SE of a level (no sign), – for none."""
    m, se = mean_se(values)
    return "–" if m != m else f"{m:.3f}" if se != se else f"{m:.3f} ± {se:.3f}"


def per_arm(recv: dict) -> list[str]:
    lines = ["| run | seeds | rounds counted | own groups with a signal | ID | ID per 10k own tokens |",
             "|---|---|---|---|---|---|"]
    for name in sorted(recv, key=lambda n: (n.rsplit("-", 1)[1], n)):
        runs = list(recv[name].values())
        counted = sorted({len(r["rounds"]) for r in runs})
        lines.append(f"| {name} | {len(runs)} | {', '.join(map(str, counted))} | "
                     f"{_level(signal_share(r) for r in runs)} | {_level(_acc(r, 'id') for r in runs)} | "
                     f"{_level(id_per_10k(r) for r in runs)} |")
    return lines


def spans(rounds: list[int]) -> str:
    """1, 2, 3, 7 -> "1–3, 7"."""
    out, start = [], None
    for i, r in enumerate(rounds):
        if start is None:
            start = r
        if i + 1 == len(rounds) or rounds[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}–{r}")
            start = None
    return ", ".join(out)


def guard_said(rounds: list[dict]) -> str:
    """The guard's levels over a run's rounds, "level 1 in rounds 25–32", or "quiet"."""
    levels = {r["round"]: r.get("swarm/guard_level") for r in rounds if r.get("swarm/guard_level")}
    return ", ".join(f"level {v} in rounds {spans([r for r, x in levels.items() if x == v])}"
                     for v in sorted(set(levels.values()))) or "quiet"


def filling(recv: dict) -> list[str]:
    """Per swarm node and seed: the rounds each kind of peer was worth a slot, and the guard's levels.
    Only kinds the node met (a worth value in some round): a kind never seen is "used" by its prior."""
    lines = []
    for arm in ("worth", "ftis"):
        for i in range(GEMMA + 1):
            for seed, run in sorted(recv.get(f"{arm}-{i}", {}).items()):
                rounds = run["rounds"]
                parts = [f"{k}: " + (f"used in rounds {used}" if (used := spans(
                             [r["round"] for r in rounds if r.get(f"worth/{k}/used")])) else "never used")
                         for k in WORTH_KINDS if any(r.get(f"worth/{k}/value") is not None for r in rounds)]
                parts.append("guard: " + guard_said(rounds))
                excluded = sum(r.get("worth/excluded") or 0 for r in rounds)
                parts.append(f"peer groups not worth a slot: {excluded}")
                lines.append(f"* {arm}-{i} s{seed}: " + "; ".join(parts))
    return lines


def seed_table(recv: dict, seed: int) -> list[str]:
    """One seed's runs as results.md tabulates them: final ID / OOD, own tokens and groups (rounds
    1..R), the in-run held-out evals and what the guard did."""
    lines = ["| run | ID | OOD | own tokens | own groups | in-run held-out | guard |",
             "|---|---|---|---|---|---|---|"]
    order = {"ftis": 0, "worth": 1, "alone": 2, "alone1": 3}
    names = [n for n in recv if seed in recv[n]]
    for name in sorted(names, key=lambda n: (int(n.rsplit("-", 1)[1]), order.get(n.rsplit("-", 1)[0], 9))):
        run = recv[name][seed]
        rounds = run["rounds"]
        acc = [_acc(run, w) for w in ("id", "ood")]
        evals = " / ".join(f"{r['eval/accuracy']:.0%}" for r in rounds if r.get("eval/accuracy") is not None)
        tokens, groups = round(total([run], "gen/tokens")), round(total([run], "groups/own"))
        lines.append(f"| {name} | " + " | ".join("–" if a is None else f"{a:.3f}" for a in acc)
                     + f" | {tokens:,} | {groups} | {evals or '–'} | "
                     + ("–" if name.startswith("alone") else guard_said(rounds)) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="run.py's --out, or docs/runs/h7")
    ap.add_argument("--batch", default="h7")
    ap.add_argument("--seed", type=int, help="print only this seed's runs, as results.md tabulates them")
    args = ap.parse_args()
    recv = load_all(args.runs).get(args.batch, {})
    if args.seed is not None:
        print("\n".join(seed_table(recv, args.seed)))
        return 0
    lines, holds = primary(recv)
    print("\n".join(lines))
    print(verdict_line(holds, len(diffs(pairs(recv, "worth", "ftis", (GEMMA,))))))
    print("\nSecondary (reported with their between-seed SE, not decided on):\n")
    print("\n".join(gemma_secondaries(recv)))
    print()
    print("\n".join(same_model_secondaries(recv)))
    print()
    print("\n".join(per_arm(recv)))
    print("\nWhich kinds of peer filled, and the guard:\n")
    print("\n".join(filling(recv)) or "(no swarm runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
