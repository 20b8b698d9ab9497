"""One GRPO round, ftis-edge vs TRL's GRPOTrainer, side by side in one process on this CPU.

A round = generate G = 8 completions for each of 4 arith prompts (up to 128 new tokens, T = 1,
no top-k/top-p, EOS ends a completion), grade them with the same binary reward, one optimizer
step on a LoRA adapter (r = 8, alpha = 16, q/k/v/o_proj, Adam lr 1e-4, micro-batch 8, grad clip 1),
and make the new weights the ones the next generation samples from.

  ftis-edge  a real ``Node`` (alone mode, default backend: llama.cpp on the F16 re-export) and
             ``node.run_round()``: generation + grading + F-TIS step + adapter sync to llama.cpp.
  TRL        ``GRPOTrainer`` (HF generate, ``use_vllm=False``) on the SAME converted fp32 HF weights
             (``bundle.hf_dir()``; never the hub), the same chat messages as a conversational prompt
             (the tokenized prompts are identical: checked below), the same reward function, the
             same EOS ids. batch 8 x 4 accumulation steps = generation batch 32 = one generation of
             4 prompts x 8 and one optimizer step per ``trainer.train()`` with max_steps = 1.
             beta = 0 (no reference model, like ftis-edge), num_iterations = 1 (on-policy).

Timing (honest version): both sides are built outside the timed region (construction times are
reported separately). Each side then runs one untimed warm-up round, so one-time costs (first
llama.cpp adapter load, accelerate's prepare, allocator warm-up) are excluded on both sides. The
timed repetitions are interleaved (ftis, TRL, ftis, TRL, ...) so background load hits both alike;
repetition k gives both sides the same 4 prompts (the node's prompts of round k). TRL is timed as
the wall time of one ``trainer.train()`` call (a fresh dataloader over that round's 4 prompts,
max_steps = 1), which includes generation, reward and the 4 micro-batch forward/backward passes;
its generation and reward times come from timers wrapped around ``_generate`` and
``_calculate_rewards``. Both sides sample freely (EOS ends a completion), so the amount of work
differs a little per round: the table shows completion tokens and samples trained per side, and
the verdict adds the ratio per completion token. Each side's CPU-seconds (the process, all
threads) are recorded too: on a shared machine they are distorted far less than wall time.

Run:
    .venv/bin/python -m benchmarks.bench_grpo_round [--reps 3] [--threads 2] [--max-new-tokens 128]
    .venv/bin/python -m benchmarks.bench_grpo_round --quick        # 1 rep, 32 tokens: a smoke test
Needs the bench extra (trl, accelerate, datasets).
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # TRL and transformers must never reach the hub
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from benchmarks.harness import parser, write_json  # noqa: E402
from ftis_edge.common import install_hint  # noqa: E402

PROMPTS, G = 4, 8
LORA = dict(r=8, alpha=16.0, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
LR, MICRO_BATCH, SEED = 1e-4, 8, 0


# --------------------------------------------------------------------------- ftis-edge side

def build_ftis(run_dir: Path, threads: int, max_new_tokens: int, train_all: bool = False,
               share_prompts: bool = True):
    """A real alone-mode node, built and synced as ``Node.run()`` does before its first round."""
    from ftis_edge.config import from_dict
    from ftis_edge.run.node import Node
    cfg = from_dict({
        "node": {"id": "bench", "run_dir": str(run_dir), "seed": SEED, "rounds": 1000},
        "model": {"spec": "smollm2-135m", "threads": threads, "device": "cpu"},
        "train": {"trainable": "lora", "lora_r": LORA["r"], "lora_alpha": LORA["alpha"],
                  "lora_dropout": 0.0, "lora_targets": LORA["targets"], "learning_rate": LR,
                  "micro_batch": MICRO_BATCH, "max_grad_norm": 1.0},
        "task": {"name": "arith", "prompts_per_round": PROMPTS, "num_generations": G,
                 "max_completion_length": max_new_tokens, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                 "reward": "binary"},
    })
    node = Node(cfg, console_log=False)
    node.build()
    node.parts.sync.sync(node.parts.learner.version)
    if train_all:
        _train_every_group()
    if not share_prompts:
        node.parts.learner.share_prompts = False
    return node


def _train_every_group():
    """--train-all: every completion goes into the step, as in TRL (a group whose rewards are all
    equal gets advantage 0 instead of being skipped: forwarded and back-propagated, no gradient)."""
    from ftis_edge.learn import batch
    rule = batch.advantages
    batch.advantages = lambda rewards, scale: rule(rewards, scale) or [0.0] * len(rewards)


def round_prompts(node, round_no: int):
    node.round = round_no
    return node.new_round().prompts()


def ftis_round(node, round_no: int) -> dict:
    node.round = round_no
    t0, c0 = time.perf_counter(), time.process_time()
    rec = node.run_round()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = rec.get("gen/tokens") or 0
    return {"wall_s": wall, "cpu_s": cpu, "gen_s": rec["time/gen_s"], "train_s": rec["time/train_s"],
            "sync_s": rec["time/sync_s"], "tokens": n, "mean_len": rec.get("completions/mean_length"),
            "reward": rec.get("reward/own"), "samples": rec.get("samples/own", 0)}


# --------------------------------------------------------------------------- TRL side

class TrlSide:
    """A GRPOTrainer configured so that one ``train()`` = one generation of 4 x 8 + one step."""

    def __init__(self, bundle, task, prompts, threads: int, max_new_tokens: int, out_dir: Path):
        import torch
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        from trl import GRPOConfig, GRPOTrainer

        torch.set_num_threads(threads)
        self.task = task
        hf_dir = bundle.hf_dir()
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        # ftis-edge stops on every end-of-generation id llama.cpp knows (<|im_end|>, <|endoftext|>).
        model.generation_config.eos_token_id = list(bundle.eos_token_ids)
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
        self.config = GRPOConfig(
            output_dir=str(out_dir), seed=SEED, use_cpu=True, bf16=False, fp16=False,
            per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=PROMPTS * G // MICRO_BATCH,
            num_generations=G, generation_batch_size=PROMPTS * G, max_steps=1,
            max_completion_length=max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, beta=0.0, num_iterations=1, scale_rewards="group",
            gradient_checkpointing=False, use_vllm=False, shuffle_dataset=False,
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
            log_completions=False, dataloader_num_workers=0)
        self.logs: list[dict] = []
        kept = self.logs

        class KeepLogs(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                kept.append(dict(logs or {}))

        self.trainer = GRPOTrainer(
            model=model, reward_funcs=self.reward, args=self.config, processing_class=tokenizer,
            train_dataset=self.dataset(prompts),
            peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                   target_modules=LORA["targets"], task_type="CAUSAL_LM"))
        self.trainer.remove_callback(PrinterCallback)   # keep stdout for the table
        self.trainer.remove_callback(ProgressCallback)
        self.trainer.add_callback(KeepLogs())
        self._timers = {"gen_s": 0.0, "reward_s": 0.0}
        for name, key in (("_generate", "gen_s"), ("_calculate_rewards", "reward_s")):
            self._wrap(name, key)

    def _wrap(self, name: str, key: str) -> None:
        inner = getattr(self.trainer, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self._timers[key] += time.perf_counter() - t0
        setattr(self.trainer, name, timed)

    def reward(self, prompts, completions, reference, **_):
        """ftis-edge's task grading as a TRL reward function (conversational completions)."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(v) for v, _ in self.task.reward_many(texts, list(reference))]

    def dataset(self, prompts):
        from datasets import Dataset
        return Dataset.from_list([{"prompt": self.task.messages(p.question), "reference": p.reference}
                                  for p in prompts])

    def prompt_ids(self, prompts) -> list[list[int]]:
        tok = self.trainer.processing_class
        out = []
        for p in prompts:
            ids = tok.apply_chat_template(self.task.messages(p.question), add_generation_prompt=True,
                                          tokenize=True)
            out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        return out

    def round(self, prompts) -> dict:
        self.trainer.train_dataset = self.dataset(prompts)
        self._timers.update(gen_s=0.0, reward_s=0.0)
        self.logs.clear()
        steps_before = self.trainer._step
        t0, c0 = time.perf_counter(), time.process_time()
        self.trainer.train()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        micro = self.trainer._step - steps_before
        if micro != self.config.gradient_accumulation_steps:
            raise RuntimeError(f"TRL ran {micro} micro-steps, expected {self.config.gradient_accumulation_steps}")
        log = next((r for r in self.logs if "completions/mean_length" in r), {})
        mean_len = log.get("completions/mean_length")
        return {"wall_s": wall, "cpu_s": cpu, "gen_s": self._timers["gen_s"], "reward_s": self._timers["reward_s"],
                "rest_s": wall - self._timers["gen_s"] - self._timers["reward_s"],
                "tokens": round(mean_len * PROMPTS * G) if mean_len is not None else None,
                "mean_len": mean_len, "reward": log.get("reward"), "samples": PROMPTS * G,
                "clipped": log.get("completions/clipped_ratio")}


# --------------------------------------------------------------------------- report

GOAL = 0.25      # issue 52: one round at equal work <= 0.25x TRL's time


def per_token_ratio(f: dict, t: dict) -> float | None:
    """The pair's ratio in seconds per completion token: both sides sample freely, so their
    completions differ in length; this puts the pair at equal tokens (time ~ tokens, roughly)."""
    if not f.get("tokens") or not t.get("tokens"):
        return None
    return (f["wall_s"] / f["tokens"]) / (t["wall_s"] / t["tokens"])


def summarize(context: dict, ftis_res: list, trl_res: list, warns, partial: bool) -> dict:
    fm = statistics.median(r["wall_s"] for r in ftis_res)
    tm = statistics.median(r["wall_s"] for r in trl_res)
    pairs = [f["wall_s"] / t["wall_s"] for f, t in zip(ftis_res, trl_res)]
    per_token = [r for r in (per_token_ratio(f, t) for f, t in zip(ftis_res, trl_res)) if r is not None]
    # CPU-seconds of this process (all threads), which a shared machine's load distorts far less
    cpu = [f["cpu_s"] / t["cpu_s"] for f, t in zip(ftis_res, trl_res) if f.get("cpu_s") and t.get("cpu_s")]
    verdict = (f"ftis-edge / TRL = {fm / tm:.2f} (goal <= {GOAL}); per-pair ratios "
               + ", ".join(f"{r:.2f}" for r in pairs)
               + ("; per completion token (median) " + f"{statistics.median(per_token):.2f}" if per_token else "")
               + ("; in CPU-seconds (median) " + f"{statistics.median(cpu):.2f}" if cpu else "")
               + (f" (partial: {len(pairs)} of {context['args']['reps']} repetitions)" if partial else ""))
    return {**context, "ftis": ftis_res, "trl": trl_res, "pair_ratios": pairs, "per_token_ratios": per_token,
            "cpu_ratios": cpu,
            "partial": partial, "median": {"ftis_s": fm, "trl_s": tm, "ratio": fm / tm},
            "load": [context["load_before"], os.getloadavg()[0]],
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "trl_warnings": sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0][:200]}"
                                    for w in warns}),
            "verdict": verdict}


def _f(v, fmt=".1f") -> str:
    return "–" if v is None else format(v, fmt)


def markdown(res: dict) -> str:
    a = res["args"]
    trl = " ".join(filter(None, ["TRL", res.get("versions", {}).get("trl")]))
    lines = [f"### One GRPO round: ftis-edge vs {trl} GRPOTrainer "
             f"(SmolLM2-135M, LoRA r=8, {PROMPTS} prompts x G={G}, <= {a['max_new_tokens']} new tokens, "
             f"{a['threads']} threads"
             + ("; ftis-edge trains every completion (--train-all)" if a.get("train_all") else "")
             + ("; learner without prompt sharing (--unshared)" if a.get("unshared") else "") + ")", "",
             "| rep | ftis-edge s | gen / train / sync s | tokens (mean len) | trained | reward "
             "| TRL s | gen / reward / rest s | tokens (mean len) | trained | reward | ftis / TRL |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (f, t) in enumerate(zip(res["ftis"], res["trl"]), 1):
        lines.append(
            f"| {i} | {f['wall_s']:.1f} | {f['gen_s']:.1f} / {f['train_s']:.1f} / {f['sync_s']:.2f} "
            f"| {f['tokens']} ({_f(f['mean_len'])}) | {f['samples']} | {_f(f['reward'], '.2f')} "
            f"| {t['wall_s']:.1f} | {t['gen_s']:.1f} / {t['reward_s']:.1f} / {t['rest_s']:.1f} "
            f"| {_f(t['tokens'], 'd')} ({_f(t['mean_len'])}) | {t['samples']} | {_f(t['reward'], '.2f')} "
            f"| {f['wall_s'] / t['wall_s']:.2f} |")
    fm, tm = res["median"]["ftis_s"], res["median"]["trl_s"]
    lines.append(f"| **median** | **{fm:.1f}** | | | | | **{tm:.1f}** | | | | | **{fm / tm:.2f}** |")
    lines += ["",
              f"Construction (untimed): ftis-edge node {res['build_s']['ftis']:.1f} s, "
              f"TRL trainer {res['build_s']['trl']:.1f} s. Warm-up round (untimed): "
              f"ftis-edge {res['warmup_s']['ftis']:.1f} s, TRL {res['warmup_s']['trl']:.1f} s. "
              f"Prompt tokens identical on both sides: {res['same_prompt_ids']}. "
              f"Load average (1 min) before / after: {res['load'][0]:.2f} / {res['load'][1]:.2f}; "
              f"peak memory (both sides in one process) {res.get('peak_rss_gib', 0):.1f} GiB."
              + (" Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()) + "."
                 if res.get("versions") else ""),
              *(["CPU-seconds of the process (all threads; not the ftis-edge grader's worker) per pair, "
                 "ftis-edge / TRL: " + ", ".join(f"{f['cpu_s']:.1f} / {t['cpu_s']:.1f}" for f, t in
                                                zip(res["ftis"], res["trl"]) if "cpu_s" in f and "cpu_s" in t)]
                if any("cpu_s" in f for f in res["ftis"]) else []),
              "'trained' = completions in the optimizer step (ftis-edge skips groups whose rewards are "
              "all equal: their advantage is 0; TRL forwards/backwards all 32).",
              "", res["verdict"]]
    return "\n".join(lines)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="1 rep, 32 new tokens (smoke test)")
    ap.add_argument("--train-all", action="store_true",
                    help="equal work: ftis-edge trains every completion, also groups without reward signal")
    ap.add_argument("--unshared", action="store_true",
                    help="the learner's old path: one full prompt + completion sequence per sample")
    ap.add_argument("--render", metavar="JSON", help="only print the table of a saved --json file")
    args = ap.parse_args()
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())))
        return 0
    if args.quick:
        args.reps, args.max_new_tokens = 1, 32
    if args.reps < 1 or args.threads < 1 or args.max_new_tokens < 1:
        ap.error("--reps, --threads and --max-new-tokens must be >= 1")

    try:
        import trl  # noqa: F401
    except ImportError:
        print(f"bench_grpo_round: {install_hint.missing('trl', 'the TRL comparison')}", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(args.threads)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    load_before = os.getloadavg()[0]
    avail = _mem_available_gib()
    if avail is not None and avail < 4.5:
        print(f"warning: only {avail:.1f} GiB of memory available; this benchmark peaks near 4 GiB",
              file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="bench_grpo_round."))
    try:
        return _run(args, tmp, load_before)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _versions() -> dict:
    import importlib
    return {m: getattr(importlib.import_module(m), "__version__", "?")
            for m in ("trl", "transformers", "peft", "accelerate", "torch", "llama_cpp")}


def _run(args, tmp: Path, load_before: float) -> int:
    def progress(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    node = build_ftis(tmp / "node", args.threads, args.max_new_tokens, args.train_all, not args.unshared)
    build_ftis_s = time.perf_counter() - t0
    progress(f"ftis-edge node built in {build_ftis_s:.1f} s")
    t0 = time.perf_counter()
    caught = io.StringIO()
    with warnings.catch_warnings(record=True) as warns, contextlib.redirect_stdout(caught):
        warnings.simplefilter("always")
        trl_side = TrlSide(node.parts.bundle, node.parts.task, round_prompts(node, 1), args.threads,
                           args.max_new_tokens, tmp / "trl")
    build_trl_s = time.perf_counter() - t0
    progress(f"TRL trainer built in {build_trl_s:.1f} s")
    same_ids = all(node.parts.bundle.encode(node.parts.bundle.render_prompt(node.parts.task.messages(p.question))) == ids
                   for p, ids in zip(round_prompts(node, 1), trl_side.prompt_ids(round_prompts(node, 1))))

    def run_trl(prompts):
        with warnings.catch_warnings(record=True) as w, contextlib.redirect_stdout(caught):
            warnings.simplefilter("always")
            out = trl_side.round(prompts)
        warns.extend(w)
        return out

    # Warm-up on round 1's prompts, then timed rounds 2.. (same prompts on both sides per round).
    warm_ftis, warm_trl = ftis_round(node, 1), run_trl(round_prompts(node, 1))
    warm = {"ftis": warm_ftis["wall_s"], "trl": warm_trl["wall_s"]}
    progress(f"warm-up: ftis-edge {warm['ftis']:.1f} s, TRL {warm['trl']:.1f} s; "
             f"ftis-edge {warm_ftis}, TRL {warm_trl}")
    ftis_res, trl_res = [], []
    context = {"args": vars(args), "build_s": {"ftis": build_ftis_s, "trl": build_trl_s}, "warmup_s": warm,
               "same_prompt_ids": same_ids, "load_before": load_before, "versions": _versions(),
               "trl_config": {k: getattr(trl_side.config, k) for k in (
                   "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                   "steps_per_generation", "num_generations", "max_completion_length", "beta", "loss_type",
                   "num_iterations", "scale_rewards", "learning_rate", "gradient_checkpointing")}}
    for k in range(2, args.reps + 2):
        prompts = round_prompts(node, k)
        ftis_res.append(ftis_round(node, k))
        trl_res.append(run_trl(prompts))
        progress(f"rep {k - 1}: ftis-edge {ftis_res[-1]}, TRL {trl_res[-1]}")
        res = summarize(context, ftis_res, trl_res, warns, partial=k < args.reps + 1)
        write_json(args.json, res)      # after every repetition: an interrupted run keeps what it measured
    node.parts.generator.close()
    print(markdown(res))
    if res["trl_warnings"]:
        print("\nTRL/transformers warnings:", *res["trl_warnings"], sep="\n  ", file=sys.stderr)
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
