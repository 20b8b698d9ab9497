"""H4's speed-up in own CPU-seconds, re-measured from a short re-run (issue 52 item 3).

    .venv/bin/python -m experiments.repro.h4_cpu --plan                # R vs wall time, from H4's records
    .venv/bin/python -m experiments.repro.h4_cpu --runs runs/h4-cpu    # the re-run's ratio, as registered

H4 (docs/results.md) measured the speed-up in own CPU-seconds: the isolated twin's CPU-seconds
to reach its own final running-mean reward ÷ the `own1` node's CPU-seconds to reach the same
value, 1.91 ± 0.17 over 4 pairs at R = 32 (`analyze.table_fill`). The round where a run reaches
that target depends on R (a short run's "final reward" is another target: ``--plan`` shows it
swing by ±1 at R < 32), so a short re-run cannot measure that quantity by itself. What a faster
learner changes is the CPU each round costs; the rounds each side needs are H4's. Per pair i:

    speed-up_i = H4's speed-up_i × s(alone-i) / s(own1-i),
    s(X) = Σ cpu/round_s of the re-run's X over rounds 1..R ÷ the same sum of the control's X

(same batch, node ids and seeds: the same prompts in rounds 1..R), mean ± SE over the pairs as
``analyze.table_fill`` prints H4's. The control is the same short re-run of the code before the
change on the same machine (``--control``); without one it is H4's own records, and then the
machine's state counts too: the same code on the same prompts (H4's isolated twins and their
repeat in docs/runs/fill-side) spent 1.22-1.31x the CPU-seconds in one invocation as in the
other. A re-run as long as H4 (R = 32) is also read by H4's own metric directly.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments.repro.analyze import ROOT, _list, _speedup, fmt, load_all, series
from ftis_edge.metrics.stats import mean_se

BATCH, ARM, PAIRS = "fill4", "own1", 4
REFERENCE = ROOT / "docs" / "runs" / "fill"      # H4's committed records (seed 0, R = 32)
START_S = 120.0      # the 8 nodes' start-up before round 1 (model load, relay join), not in time/round_s


def pairs_of(data: dict, seed: int = 0, pairs=range(PAIRS)) -> list[tuple[dict, dict]]:
    """(own1-i, alone-i) runs of ``seed`` for each i in ``pairs``; every one of them must be there."""
    recv = data.get(BATCH, {})
    names = [(f"{ARM}-{i}", f"alone-{i}") for i in pairs]
    missing = [n for pair in names for n in pair if seed not in recv.get(n, {})]
    if missing:
        raise SystemExit(f"h4_cpu: no finished {BATCH} s{seed} run for {', '.join(missing)}")
    return [(recv[a][seed], recv[b][seed]) for a, b in names]


def first(run: dict, rounds: int) -> dict:
    return {**run, "rounds": run["rounds"][:rounds]}


def cpu(run: dict, rounds: int | None = None) -> float:
    return sum(v or 0.0 for v in series(run, "cpu/round_s")[:rounds])


def plan(ref: list[tuple[dict, dict]], where: Path) -> None:
    """For each R: the wall time H4's slowest node took for R rounds (the 8 processes side by side,
    the machine partly shared), and what H4's own metric reads when the run stops at R."""
    print(f"H4's records ({where}): R, wall time of the slowest node over rounds 1..R "
          f"(+ {START_S:.0f} s start-up), H4's CPU speed-up if the run had stopped at R")
    for r in (2, 4, 8, 12, 16, 24, 32):
        cut = [(first(a, r), first(b, r)) for a, b in ref]
        wall = max(sum(v or 0.0 for v in series(run, "time/round_s")) for pair in cut for run in pair)
        speed, reached = _speedup(cut, "cpu/round_s")
        per_round = [cpu(b) / cpu(a) for a, b in cut]
        print(f"  R = {r:2d}: {(wall + START_S) / 60:5.1f} min   H4 metric at R {fmt(*mean_se(speed), 2)} "
              f"({reached}/{len(cut)} reached){_list(speed)}   CPU per round alone ÷ {ARM} "
              f"{fmt(*mean_se(per_round), 2)}")


def phases(runs: list[dict], rounds: int) -> str:
    keys = ("cpu/gen_s", "cpu/train_s", "cpu/intake_s", "cpu/round_s")
    per = {k: statistics.fmean(sum(v or 0.0 for v in series(r, k)[:rounds]) / rounds for r in runs) for k in keys}
    return " / ".join(f"{per[k]:.1f}" for k in keys)


def rescaled(new: list[tuple[dict, dict]], ref: list[tuple[dict, dict]],
             h4: list[tuple[dict, dict]] | None = None) -> dict:
    """H4's per-pair speed-ups with each side's CPU per round scaled by re-run ÷ control ``ref``
    (docstring above); ``h4`` is H4's records when the control is another run."""
    rounds = min(len(run["rounds"]) for pair in new + ref for run in pair)
    if rounds < 1:
        raise SystemExit("h4_cpu: the re-run or the control has no rounds")
    old, _ = _speedup(h4 or ref, "cpu/round_s")
    if len(old) != len(h4 or ref):
        raise SystemExit("h4_cpu: an H4 pair never reached its target; the rescaled ratio needs all of them")
    s_own = [cpu(a, rounds) / cpu(ra, rounds) for (a, _), (ra, _) in zip(new, ref)]
    s_alone = [cpu(b, rounds) / cpu(rb, rounds) for (_, b), (_, rb) in zip(new, ref)]
    return {"rounds": rounds, "h4": old, "s_own": s_own, "s_alone": s_alone,
            "speedup": [o * b / a for o, a, b in zip(old, s_own, s_alone)]}


def read(new: list[tuple[dict, dict]], ref: list[tuple[dict, dict]], h4: list[tuple[dict, dict]] | None,
         control: str) -> None:
    res = rescaled(new, ref, h4)
    rounds = res["rounds"]
    print(f"{BATCH} {ARM} + alone, {len(new)} pairs, rounds 1..{rounds} of the re-run against {control}")
    print("  CPU per round, mean over nodes, gen / train / intake / whole round (s):")
    for label, runs in ((f"re-run {ARM}", [a for a, _ in new]), ("re-run alone", [b for _, b in new]),
                        (f"control {ARM}", [a for a, _ in ref]), ("control alone", [b for _, b in ref])):
        print(f"    {label:13s} {phases(runs, rounds)}")
    print(f"  s = re-run ÷ control CPU over rounds 1..{rounds}: {ARM} {fmt(*mean_se(res['s_own']), 2)}{_list(res['s_own'])}, "
          f"alone {fmt(*mean_se(res['s_alone']), 2)}{_list(res['s_alone'])}")
    direct = [cpu(b, rounds) / cpu(a, rounds) for a, b in new]
    before = [cpu(rb, rounds) / cpu(ra, rounds) for ra, rb in ref]
    print(f"  CPU per round alone ÷ {ARM} (rounds 1..{rounds}): re-run {fmt(*mean_se(direct), 2)}{_list(direct)}, "
          f"control {fmt(*mean_se(before), 2)}{_list(before)}")
    same = [series(b, "gen/tokens")[:1] == series(rb, "gen/tokens")[:1] for (_, b), (_, rb) in zip(new, ref)]
    print(f"  round 1 own tokens of alone-i equal to the control's (same prompts, same weights): {same}")
    print(f"  H4 speed-up in own CPU-seconds: {fmt(*mean_se(res['h4']), 2)}{_list(res['h4'])}")
    print(f"  **re-measured (H4's rounds to reach × the re-run's CPU per round): "
          f"{fmt(*mean_se(res['speedup']), 2)}**{_list(res['speedup'])}   goal >= 2.5")
    if rounds >= len((h4 or ref)[0][0]["rounds"]):
        own, reached = _speedup(new, "cpu/round_s")
        print(f"  the re-run by H4's own metric (R = {rounds}): {fmt(*mean_se(own), 2)}{_list(own)} "
              f"({reached}/{len(new)} reached)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "h4-cpu", help="the re-run's --out")
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="H4's committed records")
    ap.add_argument("--control", type=Path, default=None,
                    help="the same short re-run of the code before the change (default: H4's records)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", type=int, nargs="+", default=list(range(PAIRS)),
                    help="node indices to read (a pilot of fewer nodes; the registered reading uses all 4)")
    ap.add_argument("--plan", action="store_true", help="only the wall-time estimate per R from H4's records")
    args = ap.parse_args()
    ref = pairs_of(load_all(args.reference), args.seed, args.pairs)
    if args.plan:
        plan(ref, args.reference)
        return 0
    if args.control is None:
        read(pairs_of(load_all(args.runs), args.seed, args.pairs), ref, None, f"H4's records ({args.reference})")
    else:
        read(pairs_of(load_all(args.runs), args.seed, args.pairs),
             pairs_of(load_all(args.control), args.seed, args.pairs), ref,
             f"the control {args.control}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
