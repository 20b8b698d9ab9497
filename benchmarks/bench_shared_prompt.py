"""The prompt once per group: the learner's update and the whole round, before (one full sequence per
sample) and after (each prompt once, its KV cache shared by its completions), side by side in one run.

Three measurements, all on a real default node (alone mode: SmolLM2-135M, llama.cpp generation,
4 arith prompts x G = 8, <= 128 new tokens, LoRA r = 8, micro-batch 8):

  update   one round's 32 completions (advantages: the group's, or +-0.5 for a group whose rewards
           are all equal, so every completion is back-propagated), forward + backward with
           ``share_prompts`` off and on, interleaved, on the same weights; gradients compared.
  round    paired rounds: the learner's state is restored and synced before each side, so both
           sides generate the same completions (sampling is seeded by (seed, round)) and train on
           the same samples; the wall time of ``run_round()`` and its split.
  memory   peak RSS of a fresh process per side during one default round that trains all 32
           completions (peak reset after the build; ``--rss-child`` runs one side).

Run:  .venv/bin/python -m benchmarks.bench_shared_prompt [--rounds 2] [--update-reps 3] [--threads 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, vm_bytes, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_node(run_dir: Path, threads: int):
    """The default node (every setting at its default), alone, on the CPU."""
    from ftis_edge.config import from_dict
    from ftis_edge.run.node import Node
    cfg = from_dict({"node": {"id": "bench", "run_dir": str(run_dir), "seed": 0, "rounds": 1000},
                     "model": {"threads": threads, "device": "cpu"}})
    node = Node(cfg, console_log=False)
    node.build()
    node.parts.sync.sync(node.parts.learner.version)
    return node


def all_completions(node, round_no: int):
    """Every completion of the round's own groups as a TrainSample (each one back-propagated)."""
    import torch
    from ftis_edge.learn.learner import TrainSample
    from ftis_edge.learn.objective import group_advantages
    node.round = round_no
    own, _, _ = (rnd := node.new_round()).generate(rnd.prompts())
    samples = []
    for g in own:
        adv = group_advantages(torch.tensor(g.rewards, dtype=torch.float32)).tolist()
        if not any(adv):
            adv = [0.5 if i % 2 else -0.5 for i in range(len(adv))]
        samples += [TrainSample(g.prompt_ids, list(c.token_ids), list(c.logprobs), None, a)
                    for c, a in zip(g.completions, adv)]
    return samples


def timed_gradients(learner, samples, share: bool):
    import torch
    learner.share_prompts = share
    t0 = time.perf_counter()
    learner.compute_gradients(samples)
    seconds = time.perf_counter() - t0
    flat = torch.cat([p.grad.flatten() for p in learner.trainable_state().values() if p.grad is not None])
    learner.optimizer.zero_grad(set_to_none=True)
    return seconds, flat


def measure_update(node, round_no: int, reps: int) -> dict:
    samples = all_completions(node, round_no)
    times = {False: [], True: []}
    flats = {}
    for r in range(reps):
        for share in ((False, True) if r % 2 == 0 else (True, False)):
            s, flats[share] = timed_gradients(node.parts.learner, samples, share)
            times[share].append(s)
    rel = float((flats[True] - flats[False]).norm() / flats[False].norm())
    before, after = statistics.median(times[False]), statistics.median(times[True])
    return {"samples": len(samples), "prompt_tokens": [len(samples[i].prompt_ids) for i in range(0, len(samples), 8)],
            "completion_tokens": sum(len(s.completion_ids) for s in samples),
            "before_s": times[False], "after_s": times[True], "median_before_s": before,
            "median_after_s": after, "speedup": before / after, "grad_rel_diff": rel}


def paired_round(node, round_no: int, order) -> dict:
    state = copy.deepcopy(node.parts.learner.state_dict())
    out = {}
    for share in order:
        node.parts.learner.load_state_dict(copy.deepcopy(state))
        node.parts.sync.sync(node.parts.learner.version)
        node.parts.learner.share_prompts = share
        node.round = round_no
        t0 = time.perf_counter()
        rec = node.run_round()
        out["after" if share else "before"] = {
            "wall_s": time.perf_counter() - t0, "gen_s": rec["time/gen_s"], "train_s": rec["time/train_s"],
            "sync_s": rec["time/sync_s"], "tokens": rec.get("gen/tokens"), "trained": rec.get("samples/own", 0),
            "reward": rec.get("reward/own")}
    b, a = out["before"], out["after"]
    out["same_samples"] = b["tokens"] == a["tokens"] and b["trained"] == a["trained"] and b["reward"] == a["reward"]
    out["round_speedup"] = b["wall_s"] / a["wall_s"]
    out["update_speedup"] = b["train_s"] / a["train_s"] if a["train_s"] > 0 else None
    return out


def rss_child(share: bool, threads: int) -> int:
    """One side in a fresh process: build, then one default round in which every completion is
    trained (generation of round 1's 4 x 8, the update of all 32, the weight sync); reports the
    process's peak RSS and the peak during that round alone (VmHWM reset after the build)."""
    import torch
    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_shared_prompt_rss."))
    try:
        node = build_node(tmp / "node", threads)
        node.parts.learner.share_prompts = share
        built = vm_bytes(os.getpid()) / 2**30
        try:
            Path("/proc/self/clear_refs").write_text("5")     # reset the peak: measure the round alone
            reset = True
        except OSError:
            reset = False
        samples = all_completions(node, 1)
        node.parts.learner.step(samples)
        node.parts.sync.sync(node.parts.learner.version)
        node.parts.generator.close()
        print(json.dumps({"share": share, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                          "after_build_gib": built, "round_peak_gib": vm_bytes(os.getpid()) / 2**30 if reset else None,
                          "update_samples": len(samples),
                          "update_tokens": sum(len(s.completion_ids) for s in samples)}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def markdown(res: dict) -> str:
    lines = [f"### The prompt once per group: before / after (default node, {res['args']['threads']} threads)"]
    u = res.get("update")
    if u:
        lines += ["", f"**Update, same {u['samples']} completions** ({u['completion_tokens']} completion tokens; "
                      f"prompts {', '.join(map(str, u['prompt_tokens']))} tokens), forward + backward, "
                      f"{len(u['before_s'])} interleaved repetitions: before {u['median_before_s']:.1f} s, after "
                      f"{u['median_after_s']:.1f} s (median) -> **{u['speedup']:.2f}x faster** (pairs: "
                      + ", ".join(f"{b / a:.2f}x" for b, a in zip(u["before_s"], u["after_s"]))
                      + f"); gradients agree to {u['grad_rel_diff']:.1e} (relative)."]
    if res.get("rounds"):
        lines += ["", "| round | before s (gen / train / sync) | after s (gen / train / sync) | trained | same samples | "
                  "update x | round x |", "|---|---|---|---|---|---|---|"]
        for r in res["rounds"]:
            b, a = r["before"], r["after"]
            lines.append(f"| {r['round']} | {b['wall_s']:.1f} ({b['gen_s']:.1f} / {b['train_s']:.1f} / {b['sync_s']:.2f}) "
                         f"| {a['wall_s']:.1f} ({a['gen_s']:.1f} / {a['train_s']:.1f} / {a['sync_s']:.2f}) "
                         f"| {a['trained']} | {r['same_samples']} | "
                         f"{'–' if r['update_speedup'] is None else format(r['update_speedup'], '.2f')} "
                         f"| {r['round_speedup']:.2f} |")
        wb = sum(r["before"]["wall_s"] for r in res["rounds"])
        wa = sum(r["after"]["wall_s"] for r in res["rounds"])
        lines.append(f"| **total** | **{wb:.1f}** | **{wa:.1f}** | | | | **{wb / wa:.2f}** |")
    m = res.get("memory") or {}
    if m:
        b, a = m["before"], m["after"]
        lines += ["", f"**Peak RSS** (a fresh process per side: build, then one default round that trains all "
                      f"{a['update_samples']} completions): during the round before {b['round_peak_gib']:.2f} GiB, "
                      f"after {a['round_peak_gib']:.2f} GiB ({(a['round_peak_gib'] / b['round_peak_gib'] - 1) * 100:+.0f}%); "
                      f"whole process (the build's peak included) {b['peak_rss_gib']:.2f} / {a['peak_rss_gib']:.2f} GiB."]
    lines += ["", f"Load average (1 min) before / after: {res['load'][0]:.2f} / {res['load'][1]:.2f}."]
    return "\n".join(lines)


def memory(threads: int, progress) -> dict:
    out = {}
    for side in ("before", "after"):
        run = subprocess.run([sys.executable, "-m", "benchmarks.bench_shared_prompt", "--rss-child", side,
                              "--threads", str(threads)],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        out[side] = json.loads(run.stdout.strip().splitlines()[-1])
        progress(f"memory {side}: {out[side]}")
    return out


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=2, help="paired rounds (after one warm-up round)")
    ap.add_argument("--update-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true", help="skip the two peak-RSS processes")
    ap.add_argument("--memory-only", action="store_true", help="only the two peak-RSS processes")
    ap.add_argument("--render", metavar="JSON", help="only print the table of a saved --json file")
    ap.add_argument("--rss-child", choices=("before", "after"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())))
        return 0
    if args.rss_child:
        return rss_child(args.rss_child == "after", args.threads)
    import torch
    torch.set_num_threads(args.threads)

    def progress(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench_shared_prompt."))
    res = {"args": vars(args)}
    if args.memory_only:
        res["memory"] = memory(args.threads, progress)
        res["load"] = [load_before, os.getloadavg()[0]]
        print(markdown(res))
        write_json(args.json, res)
        return 0
    try:
        node = build_node(tmp / "node", args.threads)
        node.round = 1
        node.run_round()                      # warm-up (first adapter load, allocator)
        progress("warm-up round done")
        res["update"] = measure_update(node, 2, args.update_reps)
        progress(f"update: {res['update']}")
        res["rounds"] = []
        for i, k in enumerate(range(3, 3 + args.rounds)):
            r = paired_round(node, k, (False, True) if i % 2 == 0 else (True, False))
            r["round"] = k
            res["rounds"].append(r)
            progress(f"round {k}: {r}")
        node.parts.generator.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.no_memory:
        res["memory"] = memory(args.threads, progress)
    res["load"] = [load_before, os.getloadavg()[0]]
    print(markdown(res))
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
