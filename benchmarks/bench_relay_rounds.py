"""Before/after rounds of bench_relay.py's flat-out 8 x 8, interleaved, on a noisy machine.

    .venv/bin/python -m benchmarks.bench_relay_rounds --base /path/to/old/checkout [--rounds 5]

Each round runs, one after the other: the raw XSUB/XPUB proxy, the SwarmClient row of the
tree at --base ("before") and the SwarmClient row of this tree ("after"). Each row runs in
its own interpreter with that tree first on the path, so the relay and every client process
use that tree's code. Throughput on a shared machine swings between rounds, so compare the
ratios to the proxy within a round; the last line gives the mean ratios.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import ROOT, parser

# the row runs in the tree under test, which may predate benchmarks/ as a package: both layouts import
_ROW = ("import json, sys; sys.path[:0] = ['.', 'benchmarks']; import bench_relay as b; "
        "print('ROW ' + json.dumps(b.{fn}({pubs}, {subs}, {per_pub}, {timeout})))")


def row(tree: Path, fn: str, args) -> dict:
    code = _ROW.format(fn=fn, pubs=args.pubs, subs=args.subs, per_pub=args.per_pub, timeout=args.timeout)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                         timeout=args.timeout + 120, env={**os.environ, "PYTHONPATH": str(tree)})
    for line in out.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    raise RuntimeError(f"{tree} {fn} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def main() -> None:
    ap = parser(__doc__, result=False)
    ap.add_argument("--base", type=Path, required=True, help="checkout of the 'before' tree")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pubs", type=int, default=8)
    ap.add_argument("--subs", type=int, default=8)
    ap.add_argument("--per-pub", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=90.0)
    args = ap.parse_args()
    print(f"{args.pubs} x {args.subs} flat out, {args.per_pub}/pub; CPU us/delivery pub/hub/sub")
    print(f"{'round':<6}{'proxy r/s':>10}{'before r/s (ratio)':>22}{'after r/s (ratio)':>22}"
          f"{'before CPU':>16}{'after CPU':>16}")
    ratios = {"before": [], "after": []}
    for i in range(1, args.rounds + 1):
        proxy = row(ROOT, "bench_proxy", args)
        # alternate which tree goes first, so neither always runs right after the proxy
        order = [("before", args.base.resolve()), ("after", ROOT)]
        rows = dict((name, row(tree, "bench_relay", args)) for name, tree in (order if i % 2 else order[::-1]))
        cells = []
        for name in ("before", "after"):
            r = rows[name]
            ratio = r["rollouts_s"] / proxy["rollouts_s"]
            ratios[name].append(ratio)
            ok = "" if r["complete"] else " INCOMPLETE"
            cells.append(f"{r['rollouts_s']:>10,.0f} ({ratio:.2f}x){ok}")
        cpu = ["{:.1f}/{:.1f}/{:.1f}".format(rows[n]["cpu_pub_us"], rows[n]["cpu_hub_us"], rows[n]["cpu_sub_us"])
               for n in ("before", "after")]
        print(f"{i:<6}{proxy['rollouts_s']:>10,.0f}{cells[0]:>22}{cells[1]:>22}{cpu[0]:>16}{cpu[1]:>16}"
              f"   proxy CPU {proxy['cpu_pub_us']:.1f}/{proxy['cpu_hub_us']:.1f}/{proxy['cpu_sub_us']:.1f}",
              flush=True)
    mean = {k: sum(v) / len(v) for k, v in ratios.items()}
    print(f"mean ratio to the proxy: before {mean['before']:.2f}x, after {mean['after']:.2f}x")


if __name__ == "__main__":
    main()
