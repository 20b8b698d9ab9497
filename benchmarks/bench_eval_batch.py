"""`ftis-edge eval` batched (several prompts decoded together, their shared system / few-shot
prefix decoded once) vs one prompt at a time, side by side in one process, on either backend:
llama.cpp (continuous batching, F16 weights) or HF (``--backend hf``: fixed padded batches,
hf_batch.py; float32 weights).

Both runs are the real ``evaluate()`` of ``ftis-edge eval --task arith --limit 48`` (greedy, the
default settings) on the same generator settings, alternating sequential / batched ``--reps`` times;
the answers are checked identical (and the prompts whose answers differ are counted: on HF a
batch's other matrix shapes round floats differently, which could flip a near-tied greedy token).

Run:  .venv/bin/python -m benchmarks.bench_eval_batch [--backend llamacpp|hf] [--limit 48] [--batch 16 (hf: 32)]
          [--reps 1] [--threads 2] [--max-new-tokens 256] [--json out.json]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

from benchmarks.harness import eval_args, parser, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


BATCH = {"llamacpp": 16, "hf": 32}          # the default of each: eval's --batch; the in-run eval's hf batch
ENGINE = {"llamacpp": "llama.cpp F16", "hf": "HF float32"}


def run_eval(backend: str, limit: int, batch: int, threads: int, max_new_tokens: int) -> tuple[float, dict]:
    from ftis_edge import evaluate
    args = eval_args(task="arith", backend=backend, limit=limit, batch=batch, quiet=True, threads=threads,
                     max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    result = evaluate.evaluate(args)
    return time.perf_counter() - t0, result


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--backend", choices=sorted(BATCH), default="llamacpp")
    ap.add_argument("--batch", type=int, default=None, help="sequences decoded together (llamacpp 16, hf 32)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256, help="eval's default")
    args = ap.parse_args()
    args.batch = args.batch or BATCH[args.backend]
    load_before = os.getloadavg()[0]
    times: dict[int, list[float]] = {1: [], args.batch: []}
    results = {}
    for r in range(args.reps):
        for b in ((1, args.batch) if r % 2 == 0 else (args.batch, 1)):
            seconds, results[b] = run_eval(args.backend, args.limit, b, args.threads, args.max_new_tokens)
            times[b].append(seconds)
            print(f"[{time.strftime('%H:%M:%S')}] batch {b}: {seconds:.1f} s, accuracy "
                  f"{results[b]['accuracy']:.3f}", file=sys.stderr, flush=True)
    seq, bat = results[1]["items"], results[args.batch]["items"]
    differ = sum(a["text"] != b["text"] for a, b in zip(seq, bat))
    same = differ == 0
    t_seq, t_bat = statistics.median(times[1]), statistics.median(times[args.batch])
    tokens = sum(it["tokens"] for it in seq)
    lines = [f"### `ftis-edge eval --task arith --limit {args.limit}`: batched (--batch {args.batch}) vs one "
             f"prompt at a time ({args.threads} threads, {ENGINE[args.backend]}, greedy, <= {args.max_new_tokens} new "
             f"tokens)", "",
             "| run | wall s (median of %d) | generation s | tok/s | accuracy |" % args.reps, "|---|---|---|---|---|",
             f"| one prompt at a time | {t_seq:.1f} | {results[1]['seconds']:.1f} | {results[1]['tok_s']:.0f} "
             f"| {results[1]['accuracy']:.3f} |",
             f"| batched | {t_bat:.1f} | {results[args.batch]['seconds']:.1f} | {results[args.batch]['tok_s']:.0f} "
             f"| {results[args.batch]['accuracy']:.3f} |", "",
             f"**Batched: {t_seq / t_bat:.2f}x faster** (wall); identical answers: {same} "
             f"({differ} of {len(seq)} completions differ; {tokens} tokens). Load average (1 min) before / after: "
             f"{load_before:.2f} / {os.getloadavg()[0]:.2f}."]
    print("\n".join(lines))
    write_json(args.json, {"args": vars(args), "times": {str(k): v for k, v in times.items()},
                           "identical": same, "differ": differ, "speedup": t_seq / t_bat,
                           "summary": {str(k): {kk: v for kk, v in r.items() if kk != "items"}
                                       for k, r in results.items()}})
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
