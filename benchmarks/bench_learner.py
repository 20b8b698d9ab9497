"""The learner at the machine's limit: one ``Learner.step``'s FLOP rate against fp32 matmul at its own shapes.

Side by side in one process, interleaved (learner step, then the matmul reference, per repetition, on
the same threads): the learner's achieved rate is FLOPs / wall seconds of one ``Learner.step``
(f-tis, the node's defaults otherwise), with FLOPs = 4 x N x T for LoRA (forward 2NT plus the
activation backward 2NT: frozen weights need no weight gradient) and 6 x N x T for full fine-tuning
(plus the weight gradients), N = every dense matrix of the model including the tied LM head (the
embedding lookup is no matmul; attention's own products and LoRA's rank-r matrices are not counted,
so the rate is a lower bound), T = completion tokens plus each prompt once (the learner runs each
prompt once per group). The reference is ``torch.matmul`` of the same [rows x in] x [in x out]
products (and their backward shapes) the step runs, rows = completion tokens per micro-batch, each
shape weighted by how often the model has it. The ratio is the median over repetitions, per wall
second and per CPU second of this process (on a shared machine the CPU-second ratio is the steadier
one: a descheduled process loses wall time, not CPU time; with 2+ threads it counts OpenMP spinning).

Samples: the committed real rollouts (tests/data/real_rollouts.json: SmolLM2, 4 prompts x 8
completions), either at their real lengths (18..128 tokens) or all cut/cycled to one length
(--length, "equal"). Gemma 3 270M reads the same token ids (its speed does not depend on what they
say). Advantages alternate +-1 inside each group, so every sample is back-propagated.

--profile adds where one step's time goes (torch.profiler, self CPU time by category: dense
matmuls, LM head matmul, the vocabulary-wide log-softmax and its backward, attention, LoRA layers,
optimiser and gradient clip, other tensor ops, and the rest: Python and dispatch per micro-batch),
plus the padded tokens the micro-batch plan computes beyond the real ones.

--bf16-matmul also times the same matmul products in bf16 against fp32, interleaved (wall, CPU): the
most a bf16 learner could gain on this CPU (avx512_bf16 / AMX), before casts and accuracy.

--contract measures, once per learner, the per-token |learner - generator| log-prob gap on the rollouts
at their real lengths (the generator's recorded llama.cpp log-probs): what --precision bf16 costs.

--bucket-overhead 8 32 times the step with each per-forward overhead of length_buckets (how the
learner splits a micro-batch of unequal completions into forwards), interleaved: step CPU seconds.

--ab also times, in each repetition and just before today's step, the LM head as it was before
head_logprob.py (checkpointed logsumexp chunks): the before -> after at the same moment.

--pack-ab times, in each repetition, the step with the completions in length buckets (right-padded
forwards, ``Learner(pack=False)``) and then packed into rows behind their prompts (one forward per
micro-batch, packing.py), then the reference: old and new side by side; "ratio" is the packed one,
"buckets" the bucketed one. Real lengths (18..128 tokens) are where they differ.

Run: .venv/bin/python -m benchmarks.bench_learner [--models smollm2-135m gemma3-270m] [--trainable lora full]
         [--lengths equal real] [--threads 1 2] [--reps 3] [--micro-batch 4 8 16] [--precision fp32 bf16]
         [--ab] [--pack-ab] [--bf16-matmul] [--contract] [--bucket-overhead 8 32] [--profile]
         [--json PATH]
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict

from benchmarks.harness import ROOT, parser, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROLLOUTS = ROOT / "tests" / "data" / "real_rollouts.json"
MM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")


def load_samples(lengths: str, groups: int, length: int):
    """TrainSamples from the committed rollouts: real lengths, or every completion cycled to ``length``."""
    from ftis_edge.rollout.samples import TrainSample
    data = json.loads(ROLLOUTS.read_text())
    out = []
    for g in data["groups"][:groups]:
        for i, c in enumerate(g["completions"]):
            ids, lps = list(c["token_ids"]), list(c["logprobs"])
            if lengths == "equal":
                ids = [ids[j % len(ids)] for j in range(length)]
                lps = [lps[j % len(lps)] for j in range(length)]
            out.append(TrainSample(list(g["prompt_ids"]), ids, lps, None, 1.0 if i % 2 else -1.0))
    return out


def dense_shapes(learner) -> list[tuple[int, int]]:
    """(in, out) of every dense matrix of the base model, the LM head included (LoRA's own excluded)."""
    import torch
    base = learner._hf_model
    shapes = []
    for name, mod in base.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lora_" not in name and mod is not base.get_output_embeddings():
            shapes.append((mod.in_features, mod.out_features))
    head = base.get_output_embeddings().weight
    shapes.append((head.shape[1], head.shape[0]))
    return shapes


def step_tokens(samples) -> int:
    """T: completion tokens plus each distinct prompt once."""
    prompts = {tuple(s.prompt_ids) for s in samples}
    return sum(len(s.completion_ids) for s in samples) + sum(len(p) for p in prompts)


def reference_products(shapes, rows: int, full: bool) -> Counter:
    """(m, k, n) products of one step's matmuls per dense matrix: forward x @ W^T, the activation
    gradient g @ W, and for full fine-tuning the weight gradient g^T @ x."""
    out = Counter()
    for k_in, n_out in shapes:
        out[(rows, k_in, n_out)] += 1
        out[(rows, n_out, k_in)] += 1
        if full:
            out[(n_out, rows, k_in)] += 1
    return out


def matmul_rate(products: Counter, reps: int = 3, dtype=None) -> tuple[float, float]:
    """FLOPs per wall second and per CPU second of torch.matmul (fp32 unless ``dtype``) over these
    products, each weighted by its count (median of reps)."""
    import torch
    flops = seconds = cpu = 0.0
    for (m, k, n), count in products.items():
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.matmul(a, b)
        times, cpus = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        flops += 2.0 * m * k * n * count
        seconds += statistics.median(times) * count
        cpu += statistics.median(cpus) * count
    return flops / seconds, flops / cpu


def padded_tokens(learner, samples) -> tuple[int, int]:
    """(completion tokens the plan computes incl. padding, real completion tokens)."""
    from ftis_edge.learn.shared_prompt import length_buckets, plan_micro_batches
    lens = [len(s.completion_ids) for s in samples]
    computed = 0
    for idx in plan_micro_batches([s.prompt_ids for s in samples], lens, learner.micro_batch):
        ordered = sorted(lens[i] for i in idx)
        for bucket in length_buckets(ordered):
            computed += len(bucket) * ordered[bucket[-1]]
    return computed, sum(lens)


def logprob_contract(learner, samples) -> dict:
    """Per-token |learner log-prob - generator log-prob| on the committed rollouts at their real
    lengths (the generator's are llama.cpp's at the sampling temperature, so fp32 is not 0 either)."""
    import torch
    with torch.no_grad():
        logp, mask = learner.logprobs(samples)
    gen = torch.tensor([x for s in samples for x in s.gen_logprobs])
    diff = (logp[mask] - gen).abs()
    return {"tokens": diff.numel(), "mean": float(diff.mean()), "p99": float(diff.quantile(0.99)),
            "max": float(diff.max())}


def compare_bucket_overheads(learner, samples, overheads, reps: int) -> dict:
    """Median step CPU seconds per ``length_buckets`` overhead, the values interleaved in each repetition."""
    import functools
    import ftis_edge.learn.learner as learner_module
    from ftis_edge.learn.shared_prompt import length_buckets
    cpu = {o: [] for o in overheads}
    try:
        for _ in range(reps):
            for o in overheads:
                learner_module.length_buckets = functools.partial(length_buckets, overhead=o)
                c0 = time.process_time()
                learner.step(samples, method="f-tis")
                cpu[o].append(time.process_time() - c0)
    finally:
        learner_module.length_buckets = length_buckets
    return {o: statistics.median(v) for o, v in cpu.items()}


def checkpointed_head(learner):
    """The learner's LM head before head_logprob.py (the "before" of --ab): chunks of
    logit[target] - logsumexp(logits) under activation checkpointing, so the head's matmul runs
    without grad, again in the backward, then its transpose, through autograd's vocabulary-wide graph."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
    from ftis_edge.learn.fit import LOGIT_CHUNK_ROWS

    def token_logprobs(hidden, targets, entropy=False):
        head = learner._hf_model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)

        def chunk_logp(h, w, t):
            logits = F.linear(h.float(), w.float(), None if bias is None else bias.float())
            if learner.softcap:
                logits = torch.tanh(logits / learner.softcap) * learner.softcap
            return logits.gather(1, t[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)

        out = []
        for start in range(0, hidden.shape[0], LOGIT_CHUNK_ROWS):
            h, t = hidden[start:start + LOGIT_CHUNK_ROWS], targets[start:start + LOGIT_CHUNK_ROWS]
            if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
                out.append(checkpoint(chunk_logp, h, weight, t, use_reentrant=False))
            else:
                out.append(chunk_logp(h, weight, t))
        return torch.cat(out)
    return token_logprobs


def _category(name: str, shapes, ancestors: list[str], vocab: int, lora_r: int | None) -> str:
    if any(a.startswith("Optimizer.") or a == "clip" for a in ancestors):
        return "optimiser + clip"
    dims = {d for s in shapes or [] for d in s}
    if name in MM_OPS:
        if vocab in dims:
            return "LM head matmul"
        if lora_r is not None and lora_r in dims:
            return "LoRA matmuls"
        return "dense matmuls"
    if vocab in dims:
        return "vocab log-softmax (elementwise)"
    if "attention" in name or "softmax" in name:
        return "attention"
    return "other tensor ops"


def profile_step(learner, samples, step_kwargs) -> dict:
    """Self CPU seconds of one step by category; the rest of the wall time is Python and dispatch."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    clip = torch.nn.utils.clip_grad_norm_

    def timed_clip(*a, **k):
        with record_function("clip"):
            return clip(*a, **k)
    torch.nn.utils.clip_grad_norm_ = timed_clip
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            learner.step(samples, **step_kwargs)
            wall = time.perf_counter() - t0
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    lora_r = learner.lora_config["r"] if learner.lora_config else None
    spent: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        names, parent = [], ev.cpu_parent
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        spent[_category(ev.name, ev.input_shapes, names, learner.vocab_size, lora_r)] += ev.self_cpu_time_total / 1e6
    ops = sum(spent.values())
    spent["Python, dispatch, per micro-batch"] = max(wall - ops, 0.0)
    return {"wall": wall, "seconds": dict(spent)}


def run_case(learner, samples, threads: int, reps: int, step_kwargs: dict, ab: bool = False,
             bf16: bool = False, pack_ab: bool = False) -> dict:
    import torch
    torch.set_num_threads(threads)
    shapes = dense_shapes(learner)
    N = sum(k * n for k, n in shapes)
    T = step_tokens(samples)
    full = learner.trainable == "full"
    flops = (6 if full else 4) * N * T
    n_mb = -(-len(samples) // learner.micro_batch)
    rows = round(sum(len(s.completion_ids) for s in samples) / n_mb)
    products = reference_products(shapes, rows, full)
    packs = (False, True) if pack_ab else (learner.pack,)
    for pack in packs:                            # warm-up (allocator, first-call paths)
        learner.pack = pack
        learner.step(samples, **step_kwargs)
    matmul_rate(products, reps=1)
    runs = []

    def timed_step():
        t0, c0 = time.perf_counter(), time.process_time()
        learner.step(samples, **step_kwargs)
        return time.perf_counter() - t0, time.process_time() - c0

    for _ in range(reps):
        if ab:      # the old head first, then today's, then the reference: the same moment for all three
            learner._token_logprobs = checkpointed_head(learner)
            before_s, before_cpu = timed_step()
            del learner._token_logprobs
        if pack_ab:     # the bucketed step first, then the packed one, then the reference
            learner.pack = False
            buckets_s, buckets_cpu = timed_step()
            learner.pack = True
        step_s, step_cpu = timed_step()
        ref, ref_cpu = matmul_rate(products)
        runs.append({"step_s": step_s, "step_cpu_s": step_cpu, "learner_gflops": flops / step_s / 1e9,
                     "matmul_gflops": ref / 1e9, "ratio": flops / step_s / ref,
                     "cpu_ratio": flops / step_cpu / ref_cpu})
        if ab:
            runs[-1].update(before_step_s=before_s, before_ratio=flops / before_s / ref,
                            before_cpu_ratio=flops / before_cpu / ref_cpu)
        if pack_ab:
            runs[-1].update(buckets_step_s=buckets_s, buckets_ratio=flops / buckets_s / ref,
                            buckets_cpu_ratio=flops / buckets_cpu / ref_cpu)
    out = {"threads": threads, "N": N, "T": T, "rows": rows, "flops": flops, "runs": runs,
           "ratio": statistics.median(r["ratio"] for r in runs),
           "learner_gflops": statistics.median(r["learner_gflops"] for r in runs),
           "matmul_gflops": statistics.median(r["matmul_gflops"] for r in runs),
           "cpu_ratio": statistics.median(r["cpu_ratio"] for r in runs),
           "step_s": statistics.median(r["step_s"] for r in runs),
           "step_cpu_s": statistics.median(r["step_cpu_s"] for r in runs)}
    if bf16:    # what bf16 could give at most: the same products in bf16 against fp32, same moment
        pairs = [(matmul_rate(products), matmul_rate(products, dtype=torch.bfloat16)) for _ in range(reps)]
        out["bf16_over_fp32"] = statistics.median(b[0] / f[0] for f, b in pairs)
        out["bf16_over_fp32_cpu"] = statistics.median(b[1] / f[1] for f, b in pairs)
    if ab:
        out["before_ratio"] = statistics.median(r["before_ratio"] for r in runs)
        out["before_cpu_ratio"] = statistics.median(r["before_cpu_ratio"] for r in runs)
    if pack_ab:
        for k in ("buckets_ratio", "buckets_cpu_ratio", "buckets_step_s"):
            out[k] = statistics.median(r[k] for r in runs)
        out["packed_over_buckets"] = statistics.median(r["buckets_step_s"] / r["step_s"] for r in runs)
    out["pack"] = packs[-1]
    out["load"] = os.getloadavg()[0]
    return out


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--trainable", nargs="+", default=["lora"], choices=["lora", "full"])
    ap.add_argument("--lengths", nargs="+", default=["equal", "real"], choices=["equal", "real"])
    ap.add_argument("--length", type=int, default=64, help="completion tokens of every sample for 'equal'")
    ap.add_argument("--groups", type=int, default=4, help="prompts (8 completions each) from the rollouts")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[8],
                    help="micro-batch sizes to compare (one case each; compare their step CPU seconds)")
    ap.add_argument("--ab", action="store_true",
                    help="also time the LM head as it was before head_logprob.py, interleaved (the before -> after)")
    ap.add_argument("--pack-ab", action="store_true",
                    help="time the step with length buckets and packed (packing.py), interleaved: old and new")
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                    help="the learner's precision (Learner(precision=...); bf16: CPU autocast); the "
                         "reference stays fp32 matmul")
    ap.add_argument("--bf16-matmul", action="store_true",
                    help="also time the learner's matmul shapes in bf16 against fp32 (the most bf16 could give)")
    ap.add_argument("--bucket-overhead", type=int, nargs="+", default=None,
                    help="length_buckets' per-forward overhead in tokens to compare, interleaved in each "
                         "repetition (step CPU seconds per value; default: the learner's own)")
    ap.add_argument("--contract", action="store_true",
                    help="also the per-token |learner - generator| log-prob gap on the real-length rollouts")
    ap.add_argument("--profile", action="store_true", help="also profile one step per case (first thread count)")
    args = ap.parse_args(argv)

    import torch
    from ftis_edge.learn.learner import Learner
    from ftis_edge.models.resolve import resolve_model
    result = {"torch": torch.__version__, "cases": []}
    print(f"{'model':<14}{'mode':<6}{'prec':<6}{'lengths':<8}{'thr':>4}{'mb':>4}{'T':>6}{'step s':>8}{'learner':>9}{'matmul':>8}"
          f"{'ratio':>7}{'cpu':>6}  (GFLOP/s per wall second; ratio: per wall second, cpu: per CPU second; "
          f"medians over {args.reps} interleaved reps)")
    for spec in args.models:
        hf_dir = resolve_model(spec).hf_dir()
        for trainable, precision in itertools.product(args.trainable, args.precision):
            learner = Learner(hf_dir, trainable=trainable, micro_batch=args.micro_batch[0], device="cpu",
                              precision=precision)
            if args.contract:
                gap = logprob_contract(learner, load_samples("real", args.groups, args.length))
                result.setdefault("contract", []).append(dict(gap, model=spec, trainable=trainable, precision=precision))
                print(f"{spec} {trainable} {precision}: |learner - generator| per token over {gap['tokens']} tokens: "
                      f"mean {gap['mean']:.4f}, p99 {gap['p99']:.4f}, max {gap['max']:.4f}", flush=True)
            for lengths, threads, mb in itertools.product(args.lengths, args.threads, args.micro_batch):
                samples = load_samples(lengths, args.groups, args.length)
                learner.micro_batch = mb
                case = run_case(learner, samples, threads, args.reps, {"method": "f-tis"}, args.ab,
                                args.bf16_matmul, args.pack_ab)
                case.update(model=spec, trainable=trainable, lengths=lengths, micro_batch=mb, precision=precision)
                if args.profile and threads == args.threads[0] and mb == args.micro_batch[0]:
                    case["profile"] = profile_step(learner, samples, {"method": "f-tis"})
                    case["padding"] = padded_tokens(learner, samples)
                if args.bucket_overhead:
                    case["bucket_overhead_cpu_s"] = compare_bucket_overheads(learner, samples, args.bucket_overhead,
                                                                             args.reps)
                result["cases"].append(case)
                write_json(args.json, result)
                print(f"{spec:<14}{trainable:<6}{precision:<6}{lengths:<8}{threads:>4}{mb:>4}{case['T']:>6}{case['step_s']:>8.2f}"
                      f"{case['learner_gflops']:>9.1f}{case['matmul_gflops']:>8.1f}{case['ratio']:>7.2f}{case['cpu_ratio']:>6.2f}"
                      + (f"  before head_logprob: {case['before_ratio']:.2f} {case['before_cpu_ratio']:.2f}"
                         if args.ab else "")
                      + (f"  buckets: {case['buckets_ratio']:.2f} {case['buckets_cpu_ratio']:.2f}, packed "
                         f"{case['packed_over_buckets']:.2f}x faster" if args.pack_ab else "")
                      + f"  load {case['load']:.1f}"
                      + (f"  bf16 matmul / fp32: {case['bf16_over_fp32']:.2f} {case['bf16_over_fp32_cpu']:.2f}"
                         if args.bf16_matmul else "")
                      + ("  step CPU s by bucket overhead: " + ", ".join(
                          f"{o}: {v:.2f}" for o, v in case["bucket_overhead_cpu_s"].items())
                         if args.bucket_overhead else ""),
                      flush=True)
            del learner
    for case in result["cases"]:
        if "profile" in case:
            p = case["profile"]
            computed, real = case["padding"]
            print(f"\nwhere one step's {p['wall']:.2f} s go: {case['model']} {case['trainable']} {case['lengths']} "
                  f"lengths, {case['threads']} thread(s); padding: {computed - real} of {computed} completion "
                  f"tokens computed ({(computed - real) / computed:.1%})")
            for name, s in sorted(p["seconds"].items(), key=lambda kv: -kv[1]):
                print(f"  {name:<36}{s:>7.2f} s {s / p['wall']:>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
