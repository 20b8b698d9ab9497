"""The reward rule's latency: per-call overhead of grading ordinary answers, and how fast the
pre-filter refuses answer bombs (they never reach the time-bounded grader processes).

These figures were wall-clock bounds inside unit tests (per call < 20 ms, a refusal < 10 ms); a
loaded machine made them flaky and an idle one hid regressions, so they are measured here and the
tests keep only hang guards.

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
    args = ap.parse_args()
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
    result = {
        "calls": args.calls,
        "per_call_ms": {"median": 1e3 * statistics.median(per_call), "p90": 1e3 * sorted(per_call)[int(0.9 * len(per_call))],
                        "max": 1e3 * max(per_call)},
        "refusal_ms": {k: 1e3 * v for k, v in refusals.items()},
        "grading_budget_ms": 1e3 * settings.timeout_s,
    }
    print(f"grading an ordinary answer: median {result['per_call_ms']['median']:.2f} ms, "
          f"p90 {result['per_call_ms']['p90']:.2f} ms, max {result['per_call_ms']['max']:.2f} ms "
          f"({args.calls} calls; the budget per answer is {result['grading_budget_ms']:.0f} ms)")
    print("pre-filter refusal of an answer bomb: " +
          ", ".join(f"{k!r} {v:.3f} ms" for k, v in result["refusal_ms"].items()))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
