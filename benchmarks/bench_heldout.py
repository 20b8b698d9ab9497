"""What the held-out eval inside the run costs: the default node with the eval off and on, side by side.

Two real runs of the default node (SmolLM2-135M, LoRA, llama.cpp, arith, 4 prompts x 8 completions,
128 tokens), the same node id and seed, one after the other on the same machine: ``eval.every = 0``
and ``eval.every = 1`` (an eval after every round, to time several; the eval's cost does not depend
on how often it runs). It reports per round (the training round's wall time, off vs on: the eval
must not slow training), per eval (``time/eval_s``: generation, grading and keeping the best
weights), and per run: the share of wall time a default run (``node.rounds`` rounds, an eval at
round 0, every ``eval.every`` rounds and the last) spends in the eval, from these measurements.
It also checks that the two runs trained identically (the eval draws no random number).

    .venv/bin/python -m benchmarks.bench_heldout [--rounds 3] [--threads 0] [--json docs/runs/bench-heldout.json]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRAINING_KEYS = ("reward", "loss", "grad_norm", "gen/tokens", "version")


def run_node(folder: Path, name: str, rounds: int, every: int, threads: int) -> dict:
    from ftis_edge import config
    from ftis_edge.metrics.records import read_rounds
    cfg = {"node": {"id": "bench", "run_dir": str(folder / name), "rounds": rounds, "checkpoint_every": rounds},
           "model": {"threads": threads}, "eval": {"every": every}}
    path = folder / f"{name}.toml"
    path.write_text(config.to_toml(config.from_dict(cfg), comments=False))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(path), "--headless", "--overwrite"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the node failed:\n{proc.stdout[-3000:]}")
    rounds_ = read_rounds(folder / name)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {wall:.0f} s", file=sys.stderr, flush=True)
    return {"wall_s": wall, "rounds": rounds_}


def evals_in_a_run(rounds: int, every: int) -> int:
    """Round 0, every ``every`` rounds, and the last round when it is not one of those."""
    return 1 + rounds // every + (1 if rounds % every else 0)


def main() -> int:
    from ftis_edge.config import Config
    defaults = Config()
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each run (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="model.threads (0 = the default: all cores)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-heldout-") as tmp:
        folder = Path(tmp)
        off = run_node(folder, "off", args.rounds, 0, args.threads)
        on = run_node(folder, "on", args.rounds, 1, args.threads)
    same = all({k: a.get(k) for k in TRAINING_KEYS} == {k: b.get(k) for k in TRAINING_KEYS}
               for a, b in zip(off["rounds"], on["rounds"]))
    round_off = statistics.mean(r["time/round_s"] for r in off["rounds"])
    round_on = statistics.mean(r["time/round_s"] for r in on["rounds"])
    # round 1's time/eval_s is the base model's eval plus round 1's: count evals, not records
    evals = [r["eval/wall_s"] for r in on["rounds"] if r.get("eval/wall_s") is not None]
    evals.append(on["rounds"][0]["eval/base_wall_s"])
    eval_s = statistics.mean(evals)
    kept = sum(r["time/eval_s"] for r in on["rounds"]) - sum(evals)     # keeping the best weights, logging
    per_eval = eval_s + kept / len(evals)
    n_prompts = on["rounds"][0]["eval/n"]
    tokens = statistics.mean(r["eval/tokens"] for r in on["rounds"])
    R, E = defaults.node.rounds, defaults.eval.every
    k = evals_in_a_run(R, E)
    run_eval = k * per_eval
    share = run_eval / (R * round_off + run_eval)
    out = {"rounds": args.rounds, "threads": args.threads, "load_before": load, "eval_prompts": n_prompts,
           "round_s_off": round_off, "round_s_on": round_on, "evals_timed": len(evals), "eval_s": per_eval,
           "eval_tokens": tokens, "wall_s_off": off["wall_s"], "wall_s_on": on["wall_s"],
           "default_run": {"rounds": R, "every": E, "evals": k, "eval_s": run_eval, "train_s": R * round_off,
                           "eval_share": share},
           "training_identical": same}
    lines = [f"### Held-out eval cost: the default node, eval off vs on ({args.rounds} rounds each, "
             f"model.threads {args.threads or 'all'}, load average {load:.1f} before)", "",
             "| | eval off | eval on |", "|---|---|---|",
             f"| run wall time (load, {args.rounds} rounds, evals) | {off['wall_s']:.0f} s | {on['wall_s']:.0f} s |",
             f"| training round (`time/round_s`, mean) | {round_off:.1f} s | {round_on:.1f} s |",
             f"| one held-out eval ({n_prompts} prompts, greedy, {tokens:.0f} tokens; best weights kept) | — | "
             f"{per_eval:.1f} s (mean of {len(evals)}) |",
             f"| eval per training round | — | {100 * per_eval / round_off:.0f}% of a round |", "",
             f"A default run ({R} rounds, `eval.every = {E}`: {k} evals, round 0 and the last included): "
             f"{run_eval:.0f} s of eval beside {R * round_off:.0f} s of training = **{100 * share:.1f}% of its wall "
             f"time**. Training identical with the eval on: {'yes' if same else 'NO'}."]
    print("\n".join(lines))
    write_json(args.json, out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
