"""Learner -> llama.cpp sync: log-prob agreement between PyTorch and llama.cpp after a real training step.

For SmolLM2-135M (llama arch) and Gemma 3 270M (gemma3): train a LoRA learner one step (LoRA A/B first
perturbed ~N(0, 0.05), gemma ~N(0, 0.02), so the adapter's effect is large), write the GGUF adapter, load it into llama.cpp
on the quantized base and on the F16 re-export, and compare per-token log-probs of the same completions
(sampled by llama.cpp from the adapted policy) with PyTorch + adapter. Also: the adapter written
without the llama q/k permutation, merged F16/F32 exports (LoRA folded in; after a full fine-tuning
step), and hot-swap times.

Any supported model spec works (``--model``, repeatable: an alias, a .gguf, an HF directory or hub id;
an HF model is converted once with llama.cpp's converter and its "quantized" base is Q8_0).

Run: .venv/bin/python -m benchmarks.sync_agreement [--skip-gemma] [--model SPEC ...]
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import parser
from ftis_edge.generate.base import SamplerSettings
from ftis_edge.generate.llamacpp import LlamaCppGenerator
from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.models.gguf_io import arch_layout
from ftis_edge.models.resolve import ModelError, resolve_model
from ftis_edge.run.sync import export_merged_gguf, write_gguf_lora

PROMPTS = ["Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
           "Question: A shop sells pens at 2 dollars each. How much do 7 pens cost?\nAnswer:"]


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
    d = np.abs(np.concatenate(a) - np.concatenate(b))
    ratio = np.exp(np.concatenate(a) - np.concatenate(b))
    return {"mean": d.mean(), "p99": np.quantile(d, 0.99), "max": d.max(),
            "out_0.8_1.2": float(((ratio < 0.8) | (ratio > 1.2)).mean())}


def corr(x: list[np.ndarray], y: list[np.ndarray]) -> float:
    return float(np.corrcoef(np.concatenate(x), np.concatenate(y))[0, 1])


def hf_scores(learner, samples) -> list[np.ndarray]:
    with torch.no_grad():
        logp, mask = learner.logprobs(samples)
    return [logp[b][mask[b]].double().numpy() for b in range(len(samples))]


def cpp_scores(gen, samples) -> list[np.ndarray]:
    out = []
    for s in samples:
        out += [np.asarray(x, dtype=np.float64) for x in gen.score(s.prompt_ids, [s.completion_ids])]
    return out


def perturb_lora(learner, std=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.trainable_state().values():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def sample_completions(gen, bundle, n=4, max_new=48, prompts=PROMPTS):
    samples = []
    for i, text in enumerate(prompts):
        ids = bundle.encode(text)
        for c in gen.generate(ids, n, SamplerSettings(temperature=1.0, max_new_tokens=max_new, seed=i)):
            samples.append(TrainSample(ids, c.token_ids, c.logprobs, None, 0.0))
    return samples


def real_step(learner, samples):
    """One F-TIS step on the given on-policy samples with alternating advantages."""
    adv = [1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))]
    batch = [TrainSample(s.prompt_ids, s.completion_ids, s.gen_logprobs, None, a) for s, a in zip(samples, adv)]
    return learner.step(batch)


def row(name, agr, effect_corr=None):
    c = "" if effect_corr is None else f"{effect_corr:.3f}"
    return (f"| {name} | {agr['mean']:.4f} | {agr['p99']:.4f} | {agr['max']:.4f} | "
            f"{100 * agr['out_0.8_1.2']:.1f}% | {c} |")


def bench_model(spec: str, out: Path, lines: list[str], *, full: bool) -> None:
    bundle = resolve_model(spec)
    bundle.require_supported()
    t = time.time()
    hf_dir, f16, quantized = bundle.hf_dir(), bundle.f16_gguf(), bundle.generator_gguf("quantized")
    print(f"[{spec}] conversion cache ready in {time.time() - t:.1f} s", file=sys.stderr)
    learner = Learner(hf_dir, trainable="lora", lr=1e-3, seed=0,
                      lora_targets=bundle.lora_targets(("q_proj", "k_proj", "v_proj", "o_proj")))
    # gemma's wider q/k/v projections amplify the same LoRA noise ~5x: smaller std, similar effect size
    perturb_lora(learner, std=0.05 if bundle.arch == "llama" else 0.02)
    kw = dict(n_ctx=256, max_group=4, n_threads=2)
    gen_f16 = LlamaCppGenerator(f16, eos_token_ids=bundle.eos_token_ids, **kw)
    adapter = write_gguf_lora(learner.model, out / "pre.gguf", arch=bundle.arch,
                              n_head=bundle.n_head, n_head_kv=bundle.n_head_kv)
    gen_f16.set_adapter(adapter, 0)
    prompts = PROMPTS if bundle.arch == "llama" else [p.replace("Question: ", "") for p in PROMPTS[:1]]
    samples = sample_completions(gen_f16, bundle, prompts=prompts)
    stats = real_step(learner, samples)
    t0 = time.perf_counter()
    adapter = write_gguf_lora(learner.model, out / "v1.gguf", arch=bundle.arch,
                              n_head=bundle.n_head, n_head_kv=bundle.n_head_kv)
    write_s = time.perf_counter() - t0
    permutes = arch_layout(bundle.arch).permute_qk
    wrong_label = "WITHOUT q/k permutation" if permutes else "WITH llama's q/k permutation (wrong layout)"
    noperm = write_gguf_lora(learner.model, out / "wrong-layout.gguf", arch=bundle.arch,
                             n_head=bundle.n_head, n_head_kv=bundle.n_head_kv, permute=not permutes)
    hf_lora = hf_scores(learner, samples)
    with learner.model.disable_adapter():
        hf_base = hf_scores(learner, samples)
    effect_hf = [a - b for a, b in zip(hf_lora, hf_base)]
    lines.append(f"| **{spec}** ({bundle.arch}, {sum(len(s.completion_ids) for s in samples)} tokens; "
                 f"HF adapter effect mean abs {np.abs(np.concatenate(effect_hf)).mean():.3f} nats; "
                 f"step loss {stats['loss']:.3f}) | | | | | |")
    gen_q = LlamaCppGenerator(quantized, eos_token_ids=bundle.eos_token_ids, **kw)
    swap_ms = []
    for label, gen in (("quantized", gen_q), ("F16", gen_f16)):
        gen.set_adapter(None, 0)
        base = cpp_scores(gen, samples)
        lines.append(row(f"{label} base vs HF base", agreement(base, hf_base)))
        t0 = time.perf_counter()
        gen.set_adapter(adapter, 1)
        swap_ms.append(1000 * (time.perf_counter() - t0))
        with_ad = cpp_scores(gen, samples)
        lines.append(row(f"{label} base + adapter vs HF + LoRA", agreement(with_ad, hf_lora),
                         corr([a - b for a, b in zip(with_ad, base)], effect_hf)))
        if "q_proj" in bundle.lora_targets(["q_proj"]):      # phi3 has no separate q/k to permute
            gen.set_adapter(noperm, 1)
            wrong = cpp_scores(gen, samples)
            lines.append(row(f"{label} base + adapter {wrong_label}", agreement(wrong, hf_lora),
                             corr([a - b for a, b in zip(wrong, base)], effect_hf)))
        gen.set_adapter(None, 0)
        restored = cpp_scores(gen, samples)
        exact = all(np.array_equal(a, b) for a, b in zip(restored, base))
        lines.append(f"| {label}: set_adapter(None) restores the base exactly | {exact} | | | | |")
    lines.append(f"| adapter write {1000 * write_s:.1f} ms, {adapter.stat().st_size / 1e6:.2f} MB; hot swap "
                 f"{', '.join(f'{x:.1f}' for x in swap_ms)} ms (quantized, F16) | | | | | |")
    # merged export of the LoRA policy (the "exact" mode; checks name mapping, q/k permutation, gemma norms)
    t0 = time.perf_counter()
    merged = export_merged_gguf(learner.model, bundle.base_gguf(), out / "merged-lora.gguf")
    export_s = time.perf_counter() - t0
    gen_f16.reload(merged, 1)
    lines.append(row("merged F16 export of base + LoRA vs HF + LoRA", agreement(cpp_scores(gen_f16, samples), hf_lora)))
    lines.append(f"| merged F16 export {export_s:.1f} s, {merged.stat().st_size / 1e6:.0f} MB | | | | | |")
    merged.unlink()
    if full:
        del learner
        full_l = Learner(hf_dir, trainable="full", lr=2e-5, seed=0)
        before = hf_scores(full_l, samples)
        real_step(full_l, samples)
        after = hf_scores(full_l, samples)
        effect = np.abs(np.concatenate(after) - np.concatenate(before)).mean()
        for dtype in ("f16", "f32"):
            t0 = time.perf_counter()
            merged = export_merged_gguf(full_l.model, bundle.base_gguf(), out / "merged.gguf", dtype=dtype)
            export_s = time.perf_counter() - t0
            gen_f16.reload(merged, 1)
            merged_scores = cpp_scores(gen_f16, samples)
            lines.append(row(f"merged {dtype.upper()} export after one full FT step (lr 2e-5, step effect "
                             f"mean abs {effect:.3f}) vs HF", agreement(merged_scores, after),
                             corr([a - b for a, b in zip(merged_scores, before)],
                                  [a - b for a, b in zip(after, before)])))
            lines.append(f"| merged {dtype.upper()} export {export_s:.1f} s, {merged.stat().st_size / 1e6:.0f} MB "
                         f"| | | | | |")
    gen_q.close()
    gen_f16.close()


def main():
    ap = parser(__doc__, result=False)
    ap.add_argument("--skip-gemma", action="store_true")
    ap.add_argument("--model", action="append", default=None,
                    help="model spec to measure (repeatable; default smollm2-135m and gemma3-270m)")
    ap.add_argument("--no-full", action="store_true", help="skip the full fine-tuning rows")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lines = ["| comparison (per-token log-probs, nats) | mean abs | p99 | max | ratio outside [0.8, 1.2] "
             "| corr of adapter effect |", "|---|---|---|---|---|---|"]
    specs = args.model or ["smollm2-135m"] + ([] if args.skip_gemma else ["gemma3-270m"])
    for spec in specs:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                bench_model(spec, Path(tmp), lines, full=not args.no_full and spec != "gemma3-270m")
            except ModelError as e:
                sys.exit(f"sync_agreement: {e}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
