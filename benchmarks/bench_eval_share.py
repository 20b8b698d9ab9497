"""The in-run eval's share of a run's wall time on both backends, side by side, at H6's settings.

Real nodes from H6's own configs (docs/runs/h6/h6/s0/alone-*/config.toml, alone: arith, 4 prompts
x 8 completions a round, max_completion_length 64, `eval.prompts = 32`, `model.threads = 1`):

* `llamacpp`: node 0, SmolLM2-135M LoRA on llama.cpp (T = 1.0);
* `hf-before`: node 2, SmolLM2-135M full fine-tuning on HF (T = 0.7), its generator without the
  batch steps (hf_batch.py) — the eval one prompt at a time, as in H6;
* `hf-after`: the same node as it is now (the eval's 32 prompts in one padded batch).

Each runs ``--rounds`` rounds with an eval every round (the eval's cost does not depend on how
often it runs), one after the other (``--h6`` instead: the share in H6's committed records per
node kind, from ``time/eval_s`` and each run's wall time). Per arm: the training round (`time/round_s`, mean), one eval
(generation + grading + keeping the best weights), and the share of wall time an H6 run (32 rounds,
`eval.every = 8`: evals at rounds 0, 8, 16, 24, 32) spends in the eval, from these measurements.
The two HF arms must train identically and score the same held-out tokens (the batch changes only
how the answers are decoded). The machine is shared: the 1-minute load average is printed beside
each arm; compare ratios within one run.

    .venv/bin/python -m benchmarks.bench_eval_share [--rounds 1] [--arms llamacpp,hf-before,hf-after]
        [--keep DIR | --records DIR] [--json out.json]
    .venv/bin/python -m benchmarks.bench_eval_share --h6
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_heldout import TRAINING_KEYS, evals_in_a_run
from benchmarks.harness import ROOT, parser, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")

H6 = ROOT / "docs" / "runs" / "h6" / "h6" / "s0"
ARMS = {"llamacpp": (H6 / "alone-0" / "config.toml", False),
        "hf-before": (H6 / "alone-2" / "config.toml", True),
        "hf-after": (H6 / "alone-2" / "config.toml", False)}
H6_ROUNDS, H6_EVERY = 32, 8
# "before": the HF generator without its batch steps decodes an eval one prompt at a time (loop.py)
START = ("import sys, ftis_edge.generate.hf as hf\n"
         "if sys.argv[1] == 'before':\n    hf.HFGenerator._batch_start = None\n"
         "from ftis_edge.cli import main\nsys.exit(main(sys.argv[2:]))")


def run_node(folder: Path, arm: str, rounds: int) -> dict:
    """Run one arm's node in ``folder / arm``; its metrics.jsonl stays there, with load.json beside it."""
    from ftis_edge import config
    source, before = ARMS[arm]
    cfg = config.load(source, {"node.run_dir": str(folder / arm), "node.rounds": rounds,
                               "node.checkpoint_every": rounds, "eval.every": 1})
    path = folder / f"{arm}.toml"
    path.write_text(config.to_toml(cfg, comments=False))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", START, "before" if before else "after", "start", str(path),
                           "--headless", "--overwrite"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{arm}: the node failed:\n{proc.stdout[-3000:]}")
    (folder / arm / "load.json").write_text(json.dumps({"wall_s": wall, "load_before": load,
                                                        "load_after": os.getloadavg()[0]}))
    return summarize(folder / arm, arm)


def summarize(run_dir: Path, arm: str) -> dict:
    """One arm's training round, one eval, and the share of an H6 run, from its records."""
    from ftis_edge.metrics.records import read_rounds
    recs = read_rounds(run_dir)
    evals = [r for r in recs if r.get("eval/wall_s") is not None]
    walls = [recs[0]["eval/base_wall_s"]] + [r["eval/wall_s"] for r in evals]
    # an eval round's time/eval_s = its eval + keeping the best weights (in round 1's record its
    # own, which replaces the base eval's): the keeping, per eval, from those rounds
    keep = statistics.mean(r["time/eval_s"] - r["eval/wall_s"] for r in evals) if evals else 0.0
    load_file = run_dir / "load.json"
    out = {**(json.loads(load_file.read_text()) if load_file.is_file() else {}),
           "round_s": statistics.mean(r["time/round_s"] for r in recs), "eval_s": statistics.mean(walls) + keep,
           "eval_walls": walls, "evals": len(walls), "eval_tokens": [r.get("eval/tokens") for r in recs],
           "eval_accuracy": [r.get("eval/accuracy") for r in recs],
           "training": [{k: r.get(k) for k in TRAINING_KEYS} for r in recs]}
    k = evals_in_a_run(H6_ROUNDS, H6_EVERY)
    out["h6_share"] = k * out["eval_s"] / (H6_ROUNDS * out["round_s"] + k * out["eval_s"])
    print(f"[{time.strftime('%H:%M:%S')}] {arm}: round {out['round_s']:.1f} s, eval {out['eval_s']:.1f} s, "
          f"share {100 * out['h6_share']:.1f}% (load {out.get('load_before', float('nan')):.1f} -> "
          f"{out.get('load_after', float('nan')):.1f})", file=sys.stderr, flush=True)
    return out


def h6_shares() -> list[str]:
    """The eval's share of each committed H6 run's wall time (first record to last), by node kind:
    ``time/eval_s`` over its round records (round 1's carries the base model's eval)."""
    from experiments.repro import records
    kinds = {"llamacpp": "SmolLM2 / Gemma 3 LoRA, llama.cpp (nodes 0, 1, 3)", "hf": "SmolLM2 full FT, HF (node 2)"}
    shares: dict[tuple[str, str], list[float]] = {}
    for run in sorted(p.parent for p in (H6.parent).glob("s*/*/metrics.jsonl.gz")):
        recs = records.metrics(run)
        eval_s = sum(r.get("time/eval_s", 0.0) for r in records.rounds(run))
        arm = "alone" if run.name.startswith("alone") else "swarm"
        shares.setdefault((recs[0]["backend"], arm), []).append(eval_s / (recs[-1]["time"] - recs[0]["time"]))
    lines = ["| H6 node kind | runs alone: eval share of wall time | swarm runs (ftis, protect) |", "|---|---|---|"]
    for kind, words in kinds.items():
        cells = [f"{100 * min(v):.1f}–{100 * max(v):.1f}% ({len(v)} runs)"
                 for v in (shares.get((kind, "alone"), [0.0]), shares.get((kind, "swarm"), [0.0]))]
        lines.append(f"| {words} | {cells[0]} | {cells[1]} |")
    return lines


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each run, an eval after each (default 1)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--keep", type=Path, default=None, help="run the nodes in this folder and keep their records")
    ap.add_argument("--records", type=Path, default=None,
                    help="do not run: summarise the records an earlier --keep left in this folder")
    ap.add_argument("--h6", action="store_true", help="only the share in H6's committed records (no run)")
    args = ap.parse_args()
    if args.h6:
        print("\n".join(h6_shares()))
        return 0
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        ap.error(f"--arms: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ARMS)}")
    if args.records is not None:
        missing = [a for a in arms if not (args.records / a / "metrics.jsonl").is_file()]
        if missing:
            ap.error(f"--records {args.records}: no metrics.jsonl of {', '.join(missing)}")
        res = {arm: summarize(args.records / arm, arm) for arm in arms}
        args.rounds = len(res[arms[0]]["training"])
    elif args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        res = {arm: run_node(args.keep, arm, args.rounds) for arm in arms}
    else:
        with tempfile.TemporaryDirectory(prefix="bench-eval-share-") as tmp:
            res = {arm: run_node(Path(tmp), arm, args.rounds) for arm in arms}
    k = evals_in_a_run(H6_ROUNDS, H6_EVERY)
    lines = [f"### The in-run eval's share of an H6 run ({H6_ROUNDS} rounds, an eval every {H6_EVERY}: {k} evals of "
             f"32 prompts), measured side by side ({args.rounds} round(s) per arm, an eval every round)", "",
             "| arm | training round (mean) | one eval | eval ÷ round | share of an H6 run | load (1 min) before → after |",
             "|---|---|---|---|---|---|"]
    for arm, r in res.items():
        lines.append(f"| {arm} | {r['round_s']:.1f} s | {r['eval_s']:.1f} s (mean of {r['evals']}) | "
                     f"{r['eval_s'] / r['round_s']:.2f} | **{100 * r['h6_share']:.1f}%** | "
                     f"{r.get('load_before', float('nan')):.1f} → {r.get('load_after', float('nan')):.1f} |")
    same = None
    if "hf-before" in res and "hf-after" in res:
        b, a = res["hf-before"], res["hf-after"]
        same = b["training"] == a["training"] and b["eval_tokens"] == a["eval_tokens"] \
            and b["eval_accuracy"] == a["eval_accuracy"]
        lines += ["", f"HF eval before ÷ after: **{b['eval_s'] / a['eval_s']:.1f}x** faster; same training and the "
                      f"same held-out tokens and accuracy: {'yes' if same else 'NO'}."]
    print("\n".join(lines))
    write_json(args.json, {"rounds": args.rounds, "h6": {"rounds": H6_ROUNDS, "every": H6_EVERY, "evals": k},
                           "arms": res, "hf_identical": same})
    return 0 if same in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
