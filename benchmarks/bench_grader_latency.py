"""The reward rule's latency: per-call overhead of grading ordinary answers, how fast the
pre-filter refuses answer bombs (they never reach the time-bounded grader processes), and how long
after its budget a hung answer (pre-filter off) is stopped.

These figures were wall-clock bounds inside unit tests (per call < 20 ms, a refusal < 10 ms, a
timeout overrun < 150 ms); a loaded machine made them flaky and an idle one hid regressions, so
they are measured here and the tests keep only hang guards (budget + 2 s).

    .venv/bin/python -m benchmarks.bench_grader_latency [--calls 200] [--json docs/runs/bench-grader-latency.json]
"""
from __future__ import annotations

import statistics
import time

from benchmarks.harness import parser, write_json

BOMBS = ["9^9^9", "2**2**100", "10^{1000000}", "12345678!", "(" * 50 + "1" + ")" * 50, "1" * 201]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=200, help="ordinary answers graded (default 200)")
    ap.add_argument("--hangs", type=int, default=5, help="hung answers stopped at their budget (default 5)")
    args = ap.parse_args()
    from ftis_edge.tasks import warm_up
    from ftis_edge.tasks.grader import score
    from ftis_edge.tasks.rewards import RewardSettings

    settings = RewardSettings()
    score("<answer>1</answer>", "1", settings)            # the grader processes are up before timing
    per_call = []
    for i in range(args.calls):
        t0 = time.perf_counter()
        value, _ = score(f"<answer>{i}</answer>", "50", settings)
        per_call.append(time.perf_counter() - t0)
        assert value == (1.0 if i == 50 else 0.0)
    refusals = {}
    for bomb in BOMBS:
        t0 = time.perf_counter()
        value, b = score(f"<answer>{bomb}</answer>", "5", settings)
        refusals[bomb[:24]] = time.perf_counter() - t0
        assert value == 0.0 and b["reason"].startswith("refused:"), b
    hung = RewardSettings(prefilter=False, timeout_s=0.5)
    overrun = []
    for _ in range(args.hangs):
        warm_up()                      # the killed worker's spare is up, as between a node's rounds
        t0 = time.perf_counter()
        value, b = score("<answer>9^{9^{9^{9^{9}}}}</answer>", "5", hung)
        overrun.append(time.perf_counter() - t0 - hung.timeout_s)
        assert value == 0.0 and b["timed_out"], b
    warm_up()
    result = {
        "calls": args.calls,
        "per_call_ms": {"median": 1e3 * statistics.median(per_call), "p90": 1e3 * sorted(per_call)[int(0.9 * len(per_call))],
                        "max": 1e3 * max(per_call)},
        "refusal_ms": {k: 1e3 * v for k, v in refusals.items()},
        "grading_budget_ms": 1e3 * settings.timeout_s,
        "timeout_overrun_ms": {"median": 1e3 * statistics.median(overrun), "max": 1e3 * max(overrun),
                               "hangs": args.hangs, "budget_ms": 1e3 * hung.timeout_s},
    }
    print(f"grading an ordinary answer: median {result['per_call_ms']['median']:.2f} ms, "
          f"p90 {result['per_call_ms']['p90']:.2f} ms, max {result['per_call_ms']['max']:.2f} ms "
          f"({args.calls} calls; the budget per answer is {result['grading_budget_ms']:.0f} ms)")
    print("pre-filter refusal of an answer bomb: " +
          ", ".join(f"{k!r} {v:.3f} ms" for k, v in result["refusal_ms"].items()))
    o = result["timeout_overrun_ms"]
    print(f"a hung answer (pre-filter off) is stopped {o['median']:.0f} ms after its {o['budget_ms']:.0f} ms "
          f"budget (median; max {o['max']:.0f} ms, {args.hangs} hangs)")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
