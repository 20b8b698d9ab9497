"""Does a node's process CPU time depend on what the other core runs? (issue 28, own2)

ftis-edge reports compute in process CPU-seconds (compute.py) so that a figure holds on a shared
machine. That is true for time *slicing*; it is not true when two processes run at once on two
cores and compete for memory bandwidth and cache: a stalled core still counts CPU time. The
batch-fill experiments ran 4 to 8 nodes on this 2-core machine, so this checks how far the
figure moves with the neighbour.

One process (the measured node) repeats identical work under three neighbours, interleaved
(idle, gen, train, idle, gen, train, ...):

  idle    nothing else runs (the other core is free)
  gen     a second process generates groups with llama.cpp without pause
  train   a second process runs LoRA update steps without pause

The measured work per repetition: generate the 4 groups of a fixed round (G = 8, 64 new tokens,
T = 1, llama.cpp on the F16 re-export, one thread; the fill experiments' node settings). The
weights never change and the seeds are fixed, so every repetition generates exactly the same
tokens. Then one LoRA update step on a fixed batch. Both are timed in process CPU-seconds
(``time.process_time``), as the round record's ``cpu/gen_s`` and ``cpu/train_s``.

    .venv/bin/python -m benchmarks.bench_cpu_contention [--reps 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, write_json

NEIGHBOURS = ("idle", "gen", "train")
ROUND = 3                      # the measured round's prompts (any fixed round)


def build_node(run_dir: Path):
    """An alone node with the fill experiments' settings (experiments/repro/batches.py: VALUE)."""
    from ftis_edge.config import from_dict
    from ftis_edge.run.node import Node
    cfg = from_dict({
        "node": {"id": "node-0", "run_dir": str(run_dir), "seed": 0, "rounds": 1000},
        "model": {"spec": "smollm2-135m", "backend": "llamacpp", "precision": "f16", "threads": 1,
                  "device": "cpu"},
        "train": {"trainable": "lora", "learning_rate": 2e-4, "kl_threshold": 5.0},
        "task": {"name": "arith", "prompts_per_round": 4, "num_generations": 8,
                 "max_completion_length": 64, "temperature": 1.0},
    })
    node = Node(cfg, console_log=False)
    node.build()
    node.parts.sync.sync(node.parts.learner.version)
    return node


def fixed_batch(node):
    """Training samples from one generated round (with at least one informative group)."""
    from ftis_edge.learn.batch import build_batch
    for r in range(1, 20):
        node.round = r
        own, _, _ = (rnd := node.new_round()).generate(rnd.prompts())
        samples = build_batch(own, [], mode="vertical", scale=node.cfg.train.advantage_scale,
                              local=node.parts.local_tokenizer).samples
        if samples:
            return samples
    raise SystemExit("no informative group in 19 rounds")


def neighbour(kind: str, ready: Path) -> None:
    """Run ``kind`` work without pause until killed."""
    with tempfile.TemporaryDirectory() as tmp:
        node = build_node(Path(tmp) / "neighbour")
        samples = fixed_batch(node) if kind == "train" else None
        ready.touch()
        r = 100
        while True:
            if kind == "gen":
                node.round = r
                (rnd := node.new_round()).generate(rnd.prompts())
                r += 1
            else:
                node.new_round().train(samples)


def measure(node, samples) -> dict:
    node.round = ROUND
    c0 = time.process_time()
    own, _, tokens = (rnd := node.new_round()).generate(rnd.prompts())
    c1 = time.process_time()
    node.new_round().train(samples)
    c2 = time.process_time()
    return {"gen_cpu_s": c1 - c0, "tokens": tokens, "train_cpu_s": c2 - c1}


def start_neighbour(kind: str, tmp: Path) -> subprocess.Popen | None:
    if kind == "idle":
        return None
    ready = tmp / f"ready-{kind}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cpu_contention", "--neighbour", kind,
                             "--ready", str(ready)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"neighbour {kind} died with exit code {proc.returncode}")
        if time.time() - t0 > 600:
            proc.kill()
            raise SystemExit(f"neighbour {kind} not ready after 600 s")
        time.sleep(0.5)
    return proc


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--neighbour", choices=("gen", "train"), help=argparse.SUPPRESS)
    ap.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.neighbour:
        neighbour(args.neighbour, args.ready)
        return 0
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores: the measured process and its neighbour")
    res: dict[str, list[dict]] = {k: [] for k in NEIGHBOURS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        node = build_node(tmp / "measured")
        samples = fixed_batch(node)
        measure(node, samples)                      # warm-up: first-call costs out of the timing
        for rep in range(args.reps):
            for kind in NEIGHBOURS:
                proc = start_neighbour(kind, tmp)
                try:
                    m = measure(node, samples)
                finally:
                    if proc is not None:
                        proc.kill()
                        proc.wait()
                res[kind].append(m)
                print(f"rep {rep + 1} {kind:5s}: generation {m['gen_cpu_s']:.2f} CPU-s for {m['tokens']} tokens, "
                      f"update step {m['train_cpu_s']:.2f} CPU-s", flush=True)
    tokens = {m["tokens"] for ms in res.values() for m in ms}
    if len(tokens) != 1:
        print(f"warning: the generated token counts differ between repetitions: {sorted(tokens)}")
    med = {k: {key: statistics.median(m[key] for m in ms) for key in ("gen_cpu_s", "train_cpu_s")}
           for k, ms in res.items()}
    print(f"\n| neighbour | generation CPU-s (median of {args.reps}) | ÷ idle | update step CPU-s | ÷ idle |")
    print("|---|---|---|---|---|")
    for k in NEIGHBOURS:
        g, t = med[k]["gen_cpu_s"], med[k]["train_cpu_s"]
        print(f"| {k} | {g:.2f} | {g / med['idle']['gen_cpu_s']:.2f} | {t:.2f} | {t / med['idle']['train_cpu_s']:.2f} |")
    write_json(args.json, {"runs": res, "median": med, "tokens": sorted(tokens)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
