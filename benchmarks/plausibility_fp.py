"""False positives of the plausibility defence on real honest peer rollouts (issue 25, hole 1).

The receiver is a fresh SmolLM2 LoRA learner. Each "step" calibrates on one own group (8 real
SmolLM2 llama.cpp rollouts at T = 1, tests/data/real_rollouts.json: 2 arith + 3 GSM8K prompts)
and judges honest peer samples on the other prompts through the real ``Learner.compute_gradients``
path:

* ``smollm2``: the fixture's other groups — another SmolLM2 node (llama.cpp, T = 1);
* ``hf_t0.7``: completions sampled here by the HF backend (the full-fine-tuning setup's
  generator) at T = 0.7, top-p 1, on the same prompts;
* ``gemma_span``: Gemma 3 270M (llama.cpp, T = 1) on the same questions in its own prompt
  format, turned into span-level samples as a node does for a cross-tokenizer peer
  (``batch.peer_samples``; a completion whose tokens cannot be placed on its text falls
  back to the sequence level, as in a node);
* ``full_ft``: a SmolLM2 node that fully fine-tuned for 3 rounds (its exported GGUF,
  llama.cpp, T = 0.7; --hf-per-prompt completions per prompt).

Peer samples get advantage +1 (own 0), so the token-level repeat rule
(``plausibility.RepeatMemory``, fresh for each step) judges them too; gradients are cleared
after each step and no optimiser step is taken. Each own group (up to --calibrations) takes its
turn as the calibration (the learner's own-score pool keeps the earlier turns' scores). Prints,
per kind, the fraction of peer samples that keep their weight (target: >= 99%), the samples
with tokens masked as repeated, and the fraction of tokens masked.

    python -m benchmarks.plausibility_fp [--hf-per-prompt 8] [--gemma-per-prompt 4]
        [--full-ft GGUF | --full-ft ''] [--calibrations 5] [--json PATH]
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
import time
from types import SimpleNamespace

import torch

from benchmarks.harness import ROOT, parser, write_json
from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.peers.plausibility import PlausibilityConfig, RepeatMemory

FIXTURE = ROOT / "tests" / "data" / "real_rollouts.json"
FULL_FT = ROOT / "runs" / "fill-pilot" / "fill-hetero" / "s0" / "ftis-2" / "export" / "model-f16.gguf"
MAX_NEW = 128


def sample(backend: str, bundle, prompts: list[list[int]], n: int, temperature: float, precision: str = "f16",
           threads: int = 2):
    """[[Completion]] per prompt: n samples each (top-k/p off), seeded by the prompt's index."""
    from ftis_edge.generate.base import GeneratorOptions, SamplerSettings
    from ftis_edge.generate.registry import create_generator
    gen = create_generator(backend, bundle, GeneratorOptions(precision=precision, threads=threads, max_group=n))
    out = [gen.generate(p, n, SamplerSettings(temperature=temperature, max_new_tokens=MAX_NEW, seed=k))
           for k, p in enumerate(prompts)]
    del gen
    return out


def token_samples(prompts, groups, source: str) -> list[TrainSample]:
    """Same-tokenizer peer samples: the generator's tokens and log-probs as they are."""
    return [TrainSample(p, c.token_ids, c.logprobs, None, 1.0, source=source)
            for p, comps in zip(prompts, groups) for c in comps if c.token_ids]


def gemma_samples(smol, messages: list[list[dict]], n: int) -> list[TrainSample]:
    """Gemma 3 270M rollouts as a Gemma node publishes them (its prompt format, token byte
    lengths), received as a SmolLM2 node does (``batch.peer_samples``: re-tokenized, span level)."""
    from ftis_edge.rollout.align import TokenBytes
    from ftis_edge.learn.batch import LocalTokenizer, peer_samples
    from ftis_edge.peers.intake import PeerGroup
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.rollout.wire import WireCompletion
    gemma = resolve_model("gemma3-270m")
    groups = sample("llamacpp", gemma, [gemma.encode(gemma.render_prompt(m)) for m in messages], n, 1.0)
    g_bytes = TokenBytes(gemma.tokenizer())                         # node._publish
    local = LocalTokenizer.of_bundle(smol, lambda msgs: smol.encode(smol.render_prompt(msgs)),   # as a node
                                     max_completion_length=MAX_NEW, token_bytes=TokenBytes(smol.tokenizer()))
    out = []
    for msgs, comps in zip(messages, groups):
        wire = [WireCompletion(c.token_ids, c.logprobs, c.text, 0.0, c.finish_reason,
                               g_bytes.lengths(c.token_ids, c.text)) for c in comps if c.token_ids]
        p = PeerGroup(SimpleNamespace(node_id="gemma", completions=wire), msgs, [0.0] * len(wire), 0, False)
        out += [s for s in peer_samples(p, [1.0] * len(wire), local) if s.completion_ids]
    return out


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--hf-per-prompt", type=int, default=8, help="also the full-ft peer's samples per prompt")
    ap.add_argument("--gemma-per-prompt", type=int, default=4)
    ap.add_argument("--full-ft", default=str(FULL_FT) if FULL_FT.is_file() else "",
                    help="the full-fine-tuned peer's GGUF ('' to skip)")
    ap.add_argument("--calibrations", type=int, default=5, help="own groups that take a turn as calibration")
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args(argv)
    from ftis_edge.models.resolve import resolve_model
    smol = resolve_model("smollm2-135m")
    fx = json.loads(FIXTURE.read_text())
    prompts = [g["prompt_ids"] for g in fx["groups"]]
    own = [[TrainSample(g["prompt_ids"], c["token_ids"], c["logprobs"], None, 0.0) for c in g["completions"]]
           for g in fx["groups"]]
    # the fixture's chat prompt is one user turn (+ SmolLM2's default system prompt)
    messages = [[{"role": "user", "content": re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>",
                                                       smol.decode(p), re.S).group(1)}] for p in prompts]
    makers = {}
    if args.hf_per_prompt:
        makers[f"hf_t{args.temperature}"] = lambda: token_samples(
            prompts, sample("hf", smol, prompts, args.hf_per_prompt, args.temperature), "hf")
    if args.gemma_per_prompt:
        makers["gemma_span"] = lambda: gemma_samples(smol, messages, args.gemma_per_prompt)
    if args.full_ft and args.hf_per_prompt:     # its f16 GGUF as written ("quantized": no re-export)
        makers[f"full_ft_t{args.temperature}"] = lambda: token_samples(prompts, sample(
            "llamacpp", resolve_model(args.full_ft), prompts, args.hf_per_prompt, args.temperature,
            precision="quantized"), "full_ft")
    kinds: dict[str, list[TrainSample]] = {}
    gen_s: dict[str, float] = {}
    for kind, make in makers.items():
        t0 = time.time()
        kinds[kind] = make()
        gen_s[kind] = round(time.time() - t0, 1)
    learner = Learner(smol.hf_dir(), trainable="lora", seed=0, micro_batch=8)
    cfg = PlausibilityConfig()
    judged = {k: dict(kept=0, judged=0, repeated_samples=0, repeated_tokens=0, tokens=0)
              for k in ["smollm2", *kinds]}
    scores: dict[str, list[float]] = {k: [] for k in judged}     # worst-window scores, to place the threshold
    thresholds = []
    for k, calib in enumerate(own[:args.calibrations]):
        peers = [("smollm2", TrainSample(s.prompt_ids, s.completion_ids, s.gen_logprobs, None, 1.0, source="peer"))
                 for j, g in enumerate(own) if j != k for s in g]
        # peers on the calibration's own prompt would share its micro-batches (the learner runs each
        # prompt's samples together) and the own samples that calibrate would be fewer than 8
        peers += [(kind, s) for kind, ss in kinds.items() for s in ss if s.prompt_ids != calib[0].prompt_ids]
        learner.repeat_memory = RepeatMemory()        # one step's batch, as if the node had just started
        stats = learner.compute_gradients(calib + [s for _, s in peers], cfg)
        learner.optimizer.zero_grad(set_to_none=True)     # a backward ran; never a step
        imp, rep = stats["per_sample"]["implausible"], stats["per_sample"]["repeated"]
        thresholds.append(stats["trust/threshold"])
        for i, (kind, s) in enumerate(peers):
            j, d = len(calib) + i, judged[kind]
            d["kept"] += not bool(imp[j])
            d["judged"] += 1
            d["repeated_samples"] += bool(rep[j] > 0)
            d["repeated_tokens"] += int(rep[j])
            d["tokens"] += len(s.completion_ids)
            scores[kind].append(float(stats["per_sample"]["plausibility"][j]))
    levels = {kind: dict(Counter(s.level for s in ss)) for kind, ss in kinds.items()}
    result = {"thresholds": [round(t, 3) for t in thresholds], "generation_s": gen_s, "levels": levels,
              **{kind: {**d, "kept_frac": round(d["kept"] / d["judged"], 4) if d["judged"] else None,
                        "repeated_token_frac": round(d["repeated_tokens"] / d["tokens"], 5) if d["tokens"] else None,
                        "score_quantiles": _quantiles(scores[kind])}
                 for kind, d in judged.items()}}
    write_json(args.json, result)
    print("thresholds per calibration group:", result["thresholds"])
    print("generation seconds:", gen_s, "| sample levels:", levels)
    for kind, d in judged.items():
        if d["judged"]:
            print(f"{kind:>13}: {d['kept']}/{d['judged']} keep their weight ({d['kept'] / d['judged']:.1%}); "
                  f"repeat rule: {d['repeated_samples']} samples masked, "
                  f"{d['repeated_tokens']}/{d['tokens']} tokens ({d['repeated_tokens'] / d['tokens']:.2%}); "
                  f"score quantiles 1/5/50 %: {_quantiles(scores[kind])}")
    return 0


def _quantiles(xs: list[float]) -> list[float] | None:
    t = torch.tensor([x for x in xs if math.isfinite(x)], dtype=torch.float64)
    return [round(float(torch.quantile(t, q)), 2) for q in (0.01, 0.05, 0.5)] if t.numel() else None


if __name__ == "__main__":
    raise SystemExit(main())
