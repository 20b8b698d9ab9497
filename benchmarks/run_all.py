"""Run every benchmark that fits in 35 minutes, one after another, and print one markdown document.

    benchmarks/run_all [--quick] [--out PATH] [--only NAME ...] [--list]

Benchmarks run one after another (never two at once: they measure the same CPU), each as
`python -m benchmarks.NAME` with the settings below. Each gets a section with its command, wall
time and exit status, then its output (markdown tables as they are; fixed-width text inside a
code block). A failing benchmark is reported in its section and the others still run; the exit
status is then 1 and the failed names are listed on stderr.

The settings are chosen so that the whole run fits in about 35 minutes on 2 idle cores (the
minutes below are estimates from the figures in docs/benchmarks.md, docs/relay.md and docs/node.md,
re-measured where a run_all showed them off (2026-12-03: load_relay 57 s, bench_tui_peers 33 s, bench_fit 56 s);
the document prints what each took). Run a benchmark alone for its full settings (its --help).
Not run here: the tools `calibrate_arith`, `calibrate_tasks` and `make_rollout_fixture`, and
`bench_relay_rounds` (it needs a second checkout, --base).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import ROOT, parser


@dataclass(frozen=True)
class Bench:
    module: str            # under benchmarks/: `python -m benchmarks.MODULE`
    full: tuple[str, ...]  # run_all's settings
    quick: tuple[str, ...]  # --quick: a smoke pass
    what: str
    minutes: float         # estimated wall minutes at `full` on 2 idle cores


BENCHMARKS = [
    Bench("bench_wire", (), (), "wire bytes per completion token and codec speed on real rollouts", 0.1),
    Bench("bench_relay", ("--pubs", "8", "--subs", "8", "--per-pub", "500"),
          ("--pubs", "2", "--subs", "2", "--per-pub", "100"),
          "ftis-relay vs a raw ZeroMQ proxy: throughput and latency on loopback", 0.5),
    Bench("load_relay", ("--nodes", "1000", "--seconds", "20"), ("--nodes", "100", "--seconds", "5"),
          "1,000 synthetic nodes against one relay: deliveries/s, latency, relay CPU and memory, losses", 1.0),
    Bench("attacks.flood", ("--scenario", "identity"), ("--scenario", "identity", "--identities", "50", "--seconds", "3"),
          "identity flood: N identities flood an open relay; the legitimate pair loses nothing ACKed", 0.5),
    Bench("attacks.flood", ("--scenario", "accept-budget"), ("--scenario", "accept-budget", "--seconds", "4"),
          "accept-budget flood: the honest node is never busy, loses nothing, p99 <= 1 s", 0.5),
    Bench("attacks.flood", ("--scenario", "sybil-budget"), ("--scenario", "sybil-budget", "--seconds", "4"),
          "sybil budget: fake ids cannot starve a publisher the subscriber found useful", 0.5),
    Bench("attacks.relay_memory", (), ("--seconds", "3"),
          "subscribers that do not read, against the relay's memory", 0.75),
    Bench("attacks.relay_ghosts", ("--seconds", "10", "--warm", "2", "--spread", "4", "--only", "bye"),
          ("--conns", "20", "--seconds", "6", "--warm", "1", "--spread", "2", "--only", "control", "bye"),
          "200 subscriber connections that fill their queue, then say BYE, go silent or never read: "
          "relay memory and an honest pair's throughput (all four: run it alone)", 0.4),
    Bench("attacks.sybil_first", ("--fakes", "200", "--seconds", "8", "--warm-earned", "8", "--only", "control",
                                  "fakes-200", "earned-40"), ("--fakes", "8", "--seconds", "4", "--only", "control", "fakes-8"),
          "fake ids that came first cannot keep a new honest publisher out of a budgeted subscriber", 0.8),
    Bench("attacks.relay_replies", ("--conns", "0", "100", "--seconds", "15"), ("--conns", "0", "10", "--seconds", "5"),
          "connections that ask and never read: every reply counted, the relay's RSS bounded, honest traffic delivered", 1.0),
    Bench("attacks.grading_flood", ("--fakes", "40", "--rounds", "1"), ("--fakes", "8", "--rounds", "1"),
          "many ids whose answers grade just under the time limit cannot keep an honest peer ungraded", 0.1),
    Bench("attacks.cwd_code", (), (),
          "modules planted in the current directory: no child interpreter the project starts imports them", 0.15),
    Bench("attacks.best_state", (), (),
          "a crafted best-weights state: escapes, non-table fields, a huge file, wrong shapes; export refuses in one line", 0.3),
    Bench("grader_corpus", (), (),
          "both directions of the math grader on the committed corpus: computations scored, honest results refused", 0.3),
    Bench("attacks.grading_sybils", ("--ids", "200", "--rounds", "2", "--lead", "1", "--runs", "1"),
          ("--ids", "50", "--rounds", "1", "--lead", "1", "--runs", "1"),
          "Sybil ids with cheap answers cannot slice an honest peer's grading away, any arrival order", 0.3),
    Bench("attacks.grading_sybils_clock", ("--ids", "2000,10000", "--rounds", "30"),
          ("--ids", "300", "--rounds", "3", "--kinds", "zero", "--orders", "together"),
          "an honest new peer's share of grading among 2,000 and 10,000 Sybil ids, on a made-up clock", 0.2),
    Bench("bench_grader_latency", (), ("--calls", "20"),
          "the reward rule's latency: per-call grading overhead, how fast answer bombs are refused, a hang's overrun", 0.3),
    Bench("bench_tui_peers", (), ("--peers", "1000", "--rounds", "1"),
          "the dashboard with 10,000 peers: mount, Peers tab, a new round", 0.6),
    Bench("bench_generate", ("--reps", "1", "--hf-reps", "1", "--threads", "2"),
          ("--reps", "1", "--hf-reps", "1", "--threads", "2"),
          "group generation speed: LlamaCppGenerator vs bare llama.cpp vs HF generate()", 2.0),
    Bench("sync_agreement", ("--skip-gemma",), ("--skip-gemma", "--no-full"),
          "learner -> llama.cpp log-prob agreement after a real training step", 2.0),
    Bench("cross_tokenizer_weights", (), ("--prompts", "1", "--group", "2", "--max-new-tokens", "32"),
          "importance weights of real cross-tokenizer peer samples, per level", 0.6),
    Bench("bench_eval_batch", ("--reps", "1"), ("--limit", "8", "--batch", "4", "--max-new-tokens", "64"),
          "ftis-edge eval: continuous batching vs one prompt at a time, answers identical", 1.6),
    Bench("bench_grpo_round", ("--reps", "1", "--threads", "2", "--max-new-tokens", "64"), ("--quick",),
          "one GRPO round, ftis-edge vs TRL GRPOTrainer (needs ./install.sh --bench)", 3.0),
    Bench("bench_shared_prompt", ("--rounds", "1", "--update-reps", "1", "--no-memory"),
          ("--rounds", "1", "--update-reps", "1", "--no-memory"),
          "the prompt once per group: the update and a whole round, before vs after", 3.0),
    Bench("bench_cpu_contention", ("--reps", "1"), ("--reps", "1"),
          "a node's CPU-seconds beside an idle, a generating and a training neighbour", 2.0),
    Bench("bench_learner", ("--threads", "1", "--reps", "1", "--lengths", "equal", "--groups", "1"),
          ("--threads", "1", "--reps", "1", "--lengths", "equal", "--groups", "1"),
          "the learner's FLOP rate against fp32 matmul at its own shapes, same threads, side by side", 0.4),
    Bench("bench_fit", ("--only", "smollm2-135m lora"), ("--only", "smollm2-135m lora"),
          "fit.py's memory estimate against a real node's peak RSS", 1.0),
    Bench("bench_heldout", ("--rounds", "1"), ("--rounds", "1"),
          "the held-out eval inside the run: its cost beside a training round", 3.0),
    Bench("bench_eval_share", ("--arms", "hf-after"), ("--arms", "hf-after"),
          "the in-run eval's share of an H6 run on the HF full-fine-tuning node (all arms: run it alone)", 1.5),
    Bench("plausibility_fp", ("--hf-per-prompt", "2", "--gemma-per-prompt", "2", "--calibrations", "2",
                              "--full-ft", ""),
          ("--hf-per-prompt", "1", "--gemma-per-prompt", "0", "--calibrations", "1", "--full-ft", ""),
          "false positives of the plausibility defence on honest real peer rollouts", 3.0),
    Bench("foreign_kept", (), (), "honest Gemma 3 text (a committed fixture) a SmolLM2 learner keeps: judge, memories, both",
          0.5),
    Bench("foreign_honest_stream", ("--steps", "1"), ("--steps", "1"),
          "two honest Gemma peers' text over a run: what the pull budget and the direction bound keep "
          "(60 steps: --steps 60, ~10 min)", 0.3),
    Bench("attacks.poison", ("--steps", "5"), ("--steps", "1", "--arms", "undefended,defended"),
          "a phrase smuggled inside correct answers: how far it trains in, defended and not", 2.0),
    Bench("attacks.poison_foreign", ("--steps", "2", "--attacks", "templates"),
          ("--steps", "1", "--attacks", "templates", "--arms", "control,after"),
          "a payload from a peer that claims another tokenizer: its rise, control / today's judge and weight bound", 0.7),
]


def estimate_minutes(benches: list[Bench]) -> float:
    return sum(b.minutes for b in benches)


def run_one(bench: Bench, args: tuple[str, ...], timeout_s: float) -> tuple[int, str, str, float]:
    cmd = [sys.executable, "-m", f"benchmarks.{bench.module}", *args]
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


def section(bench: Bench, args: tuple[str, ...], rc: int, out: str, err: str, secs: float) -> str:
    cmd = " ".join([".venv/bin/python", "-m", f"benchmarks.{bench.module}", *args])
    status = "ok" if rc == 0 else f"**FAILED (exit {rc})**"
    lines = [f"## {bench.module}", "", f"{bench.what}.", "", f"`{cmd}` — {secs:.0f} s, {status}", ""]
    body = out.rstrip()
    if body:
        is_markdown = any(line.startswith("|") for line in body.splitlines())
        lines += [body] if is_markdown else ["```", body, "```"]
    if rc != 0:
        tail = "\n".join(err.rstrip().splitlines()[-25:])
        lines += ["", "stderr (last lines):", "", "```", tail, "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, result=False)
    ap.add_argument("--quick", action="store_true", help="smoke pass: every benchmark at its smallest settings")
    ap.add_argument("--out", type=Path, help="also write the markdown document to this file")
    ap.add_argument("--only", nargs="+", choices=sorted({b.module for b in BENCHMARKS}), help="run only these")
    ap.add_argument("--timeout", type=float, default=1800, help="per benchmark, seconds (default 30 min)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks, their settings and estimates")
    args = ap.parse_args(argv)

    benches = [b for b in BENCHMARKS if not args.only or b.module in args.only]
    if args.list:
        for b in benches:
            print(f"{b.minutes:5.1f} min  python -m benchmarks.{b.module} {' '.join(b.full)}  — {b.what}")
        print(f"{estimate_minutes(benches):5.1f} min in all (estimate, 2 idle cores)")
        return 0
    load = os.getloadavg()
    doc = [f"# ftis-edge benchmarks ({'quick' if args.quick else 'run_all'} settings)", "",
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
           f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start.", ""]
    print("\n".join(doc), flush=True)
    failed = []
    t_all = time.perf_counter()
    for b in benches:
        bench_args = b.quick if args.quick else b.full
        print(f"[run_all] {b.module} {' '.join(bench_args)} ...", file=sys.stderr, flush=True)
        rc, out, err, secs = run_one(b, bench_args, args.timeout)
        if rc != 0:
            failed.append(" ".join([b.module, *bench_args]))
            print(f"[run_all] {b.module} FAILED (exit {rc})", file=sys.stderr, flush=True)
        text = section(b, bench_args, rc, out, err, secs)
        doc.append(text)
        print(text, flush=True)
    tail = f"Total {time.perf_counter() - t_all:.0f} s; " + \
        (f"FAILED: {', '.join(failed)}." if failed else f"all {len(benches)} benchmarks passed.")
    doc.append(tail)
    print(tail, flush=True)
    if args.out:
        args.out.write_text("\n".join(doc) + "\n")
    if failed:
        print(f"[run_all] failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
