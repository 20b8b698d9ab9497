"""Group generation speed: ftis-edge's LlamaCppGenerator vs the engine's limit vs HF generate().

One GRPO group: G = 8 completions of one SmolLM2 chat prompt, 128 new tokens each (EOS ignored,
so every engine produces exactly G x 128 tokens), T = 1, no truncation. Side by side, in one run:

  (a) LlamaCppGenerator (quantized Q4_1 as shipped, and the F16 re-export)
  (b) a bare low-level llama-cpp-python loop written here: same batching, numpy sampling, nothing else
  (c) HF transformers generate(), batch 8, fp32 on CPU (the HF generator's own loop is shown too)

Repetitions are interleaved so background load hits every engine alike. Usage:
    .venv/bin/python -m benchmarks.bench_generate [--reps 3] [--threads 2]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from benchmarks.harness import parser

G, NEW_TOKENS = 8, 128
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
            "in May. How many clips did Natalia sell altogether in April and May?")


class BareLoop:
    """The minimum llama-cpp-python code for a batched group: the engine's speed limit."""

    def __init__(self, path, threads):
        import llama_cpp as ll
        self.ll = ll
        self.model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
        p = ll.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 2048, 512, 512, G
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = True
        self.ctx = ll.llama_init_from_model(self.model, p)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(512, 0, G)

    def run(self, ids, seed):
        ll, b = self.ll, self.batch
        rng = np.random.default_rng(seed)
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        for i, t in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, G, i == len(ids) - 1
            for s in range(G):
                b.seq_id[i][s] = s
        b.n_tokens = len(ids)
        ll.llama_decode(self.ctx, b)
        last = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, len(ids) - 1), shape=(self.n_vocab,))
        logits = np.repeat(last[None].astype(np.float64), G, axis=0)
        for step in range(NEW_TOKENS):
            e = np.exp(logits - logits.max(1, keepdims=True))
            cdf = np.cumsum(e, 1)
            toks = [int(np.searchsorted(c, u * c[-1], side="right")) for c, u in zip(cdf, rng.random(G))]
            if step == NEW_TOKENS - 1:
                break
            for s, t in enumerate(toks):
                b.token[s], b.pos[s], b.n_seq_id[s], b.logits[s] = t, len(ids) + step, 1, True
                b.seq_id[s][0] = s
            b.n_tokens = G
            ll.llama_decode(self.ctx, b)
            for s in range(G):
                logits[s] = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, s), shape=(self.n_vocab,))
        return G * NEW_TOKENS

    def close(self):
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def timed(fn) -> float:
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0)


def main():
    ap = parser(__doc__, result=False)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hf-reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from ftis_edge.generate.base import SamplerSettings
    from ftis_edge.generate.hf import HFGenerator
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.models.resolve import resolve_model

    t_start = time.time()
    load_before = os.getloadavg()[0]
    bundle = resolve_model("smollm2-135m")
    ids = bundle.encode(bundle.render_prompt([{"role": "user", "content": QUESTION}]))
    sampler = SamplerSettings(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=0)

    engines, warm = {}, []
    for prec in ("quantized", "f16"):
        gen = LlamaCppGenerator.from_bundle(bundle, prec, n_ctx=1024, max_group=G, n_threads=args.threads)
        warm.append(gen)
        engines[f"(a) LlamaCppGenerator {prec}"] = (
            lambda gen=gen: sum(len(c.token_ids) for c in gen.generate(ids, G, sampler, ignore_eos=True)))
        bare = BareLoop(bundle.generator_gguf(prec), args.threads)
        engines[f"(b) bare low-level loop {prec}"] = lambda bare=bare: bare.run(ids, 0)

    model = AutoModelForCausalLM.from_pretrained(bundle.hf_dir(), dtype=torch.float32).eval()
    input_ids = torch.tensor([ids] * G)

    def hf_generate():
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, pad_token_id=2)
        return (out.shape[1] - len(ids)) * G

    hf_gen = HFGenerator(model, bundle.tokenizer(), device="cpu", eos_token_ids=bundle.eos_token_ids)
    hf_engines = {
        "(c) HF generate() fp32 batch 8": hf_generate,
        "    HFGenerator (own loop) fp32": lambda: sum(
            len(c.token_ids) for c in hf_gen.generate(ids, G, sampler, ignore_eos=True)),
    }

    for gen in warm:        # page the weights in (the bare loops map the same files)
        gen.generate(ids, G, SamplerSettings(max_new_tokens=4), ignore_eos=True)
    results: dict[str, list[float]] = {k: [] for k in list(engines) + list(hf_engines)}
    for _ in range(args.reps):
        for name, fn in engines.items():
            results[name].append(timed(fn))
            print(f"  {name}: {results[name][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    for _ in range(args.hf_reps):
        for name, fn in hf_engines.items():
            results[name].append(timed(fn))
            print(f"  {name}: {results[name][-1]:.1f} tok/s", file=sys.stderr, flush=True)

    mean = {k: statistics.mean(v) for k, v in results.items()}
    hf_ref = mean["(c) HF generate() fp32 batch 8"]
    print(f"SmolLM2-135M, G={G} x {NEW_TOKENS} new tokens, T=1, threads={args.threads}, prompt {len(ids)} tokens, "
          f"load avg {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'engine':36s} {'tok/s mean':>10s} {'min':>7s} {'max':>7s} {'vs (b)':>7s} {'vs (c)':>7s}")
    for name, vals in results.items():
        prec = "f16" if "f16" in name else "quantized"
        bare = mean.get(f"(b) bare low-level loop {prec}")
        vs_b = f"{mean[name] / bare:.2f}x" if name.startswith("(a)") else ""
        print(f"{name:36s} {mean[name]:10.1f} {min(vals):7.1f} {max(vals):7.1f} {vs_b:>7s} "
              f"{mean[name] / hf_ref:6.2f}x")
    print(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
