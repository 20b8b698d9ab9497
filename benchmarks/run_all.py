"""Run every benchmark in benchmarks/ with short settings and print one markdown document.

    benchmarks/run_all [--quick] [--out PATH] [--only NAME ...]

Benchmarks run one after another (never two at once: they measure the same CPU). Each gets a
section with its command, wall time and exit status, then its output (markdown tables as they
are; fixed-width text inside a code block). A failing benchmark is reported in its section and
the others still run; the exit status is then 1 and the failed names are listed on stderr.
Measured on 2 idle cores: the four benchmarks other than bench_grpo_round took 397 s at full
settings; bench_grpo_round adds about 3 minutes (one interleaved pair at 64 tokens).
``calibrate_arith.py`` and ``make_rollout_fixture.py`` are tools, not benchmarks: not run here.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# name -> (full arguments, quick arguments, what it measures)
BENCHMARKS = {
    "bench_wire": ([], [], "wire bytes per completion token and codec speed on real rollouts"),
    "bench_relay": (["--pubs", "8", "--subs", "8", "--per-pub", "500"],
                    ["--pubs", "2", "--subs", "2", "--per-pub", "100"],
                    "ftis-relay vs a raw ZeroMQ proxy: throughput and latency on loopback"),
    "bench_generate": (["--reps", "1", "--hf-reps", "1", "--threads", "2"],
                       ["--reps", "1", "--hf-reps", "1", "--threads", "2"],
                       "group generation speed: LlamaCppGenerator vs bare llama.cpp vs HF generate()"),
    "sync_agreement": ([], ["--skip-gemma"],
                       "learner -> llama.cpp log-prob agreement after a real training step"),
    "bench_grpo_round": (["--reps", "1", "--threads", "2", "--max-new-tokens", "64"], ["--quick"],
                         "one GRPO round, ftis-edge vs TRL GRPOTrainer"),
}


def run_one(name: str, args: list[str], timeout_s: float) -> tuple[int, str, str, float]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
            f"\n[run_all] timed out after {timeout_s:g} s"
    return rc, out, err, time.perf_counter() - t0


def section(name: str, args: list[str], what: str, rc: int, out: str, err: str, secs: float) -> str:
    cmd = " ".join([".venv/bin/python", f"benchmarks/{name}.py", *args])
    status = "ok" if rc == 0 else f"**FAILED (exit {rc})**"
    lines = [f"## {name}", "", f"{what}.", "", f"`{cmd}` — {secs:.0f} s, {status}", ""]
    body = out.rstrip()
    if body:
        is_markdown = any(line.startswith("|") for line in body.splitlines())
        lines += [body] if is_markdown else ["```", body, "```"]
    if rc != 0:
        tail = "\n".join(err.rstrip().splitlines()[-25:])
        lines += ["", "stderr (last lines):", "", "```", tail, "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke pass (~3 min)")
    ap.add_argument("--out", help="also write the markdown document to this file")
    ap.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these")
    ap.add_argument("--timeout", type=float, default=1200, help="per benchmark, seconds")
    args = ap.parse_args()

    names = args.only or list(BENCHMARKS)
    load = os.getloadavg()
    doc = [f"# ftis-edge benchmarks ({'quick' if args.quick else 'full'} settings)", "",
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
           f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start.", ""]
    print("\n".join(doc), flush=True)
    failed = []
    t_all = time.perf_counter()
    for name in names:
        full, quick, what = BENCHMARKS[name]
        bench_args = quick if args.quick else full
        print(f"[run_all] {name} {' '.join(bench_args)} ...", file=sys.stderr, flush=True)
        rc, out, err, secs = run_one(name, bench_args, args.timeout)
        if rc != 0:
            failed.append(name)
            print(f"[run_all] {name} FAILED (exit {rc})", file=sys.stderr, flush=True)
        text = section(name, bench_args, what, rc, out, err, secs)
        doc.append(text)
        print(text, flush=True)
    tail = f"Total {time.perf_counter() - t_all:.0f} s; " + \
        (f"FAILED: {', '.join(failed)}." if failed else f"all {len(names)} benchmarks passed.")
    doc.append(tail)
    print(tail, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(doc) + "\n")
    if failed:
        print(f"[run_all] failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
