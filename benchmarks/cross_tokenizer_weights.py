"""Importance weights of real cross-tokenizer peer samples, per level (sequence / span / token).

    .venv/bin/python -m benchmarks.cross_tokenizer_weights [--prompts 3] [--group 4] [--max-new-tokens 96]

For each (generator → learner) pair, the generator samples real groups of completions on
arith prompts (llama.cpp, T = 1, its own prompt format) with their behaviour log-probs and
token byte lengths (what the wire carries); the learner (PyTorch, untrained LoRA = the base
model) re-tokenizes each text as a node does and scores it. Then, with the real objective
(`ftis_loss`, C = 2, kl_threshold = 5, advantages from the task's rewards), it prints per
level: the per-sample mean weight's quantiles, the fraction of tokens whose weight hit C,
ESS, the filter's KL-rule rate (KL > g) and drop rate, and the mean |log-ratio| per unit
(token, span or sequence). The token level exists only for a same-tokenizer pair (the
SmolLM2 → SmolLM2 row, which is also the check that span level = token level there).
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from benchmarks.harness import parser
from ftis_edge.rollout.align import TokenBytes, shared_spans, span_sums
from ftis_edge.generate.base import GeneratorOptions, SamplerSettings
from ftis_edge.generate.registry import create_generator
from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.models.resolve import resolve_model
from ftis_edge.learn.objective import ess_fraction, ftis_loss, group_advantages
from ftis_edge.tasks import get_task

C, KL_G = 2.0, 5.0


def generate(bundle, task, prompts, group, max_new, seed):
    """[(prompt, [Completion...], rewards)] sampled by the bundle's model with llama.cpp."""
    # as a node builds it: a base model in the plain format stops at its next "User:" turn
    gen = create_generator("llamacpp", bundle, GeneratorOptions(precision="f16", threads=2, max_group=group))
    out = []
    try:
        for i, p in enumerate(prompts):
            ids = bundle.encode(bundle.render_prompt(task.messages(p.question)))
            comps = gen.generate(ids, group, SamplerSettings(temperature=1.0, max_new_tokens=max_new,
                                                             seed=seed + i))
            rewards = [r for r, _ in task.reward_many([c.text for c in comps], [p.reference] * len(comps))]
            out.append((p, comps, rewards))
    finally:
        gen.close()
    return out


def samples_for(learner_bundle, task, groups, peer_bytes: TokenBytes, same_tokenizer: bool):
    """Per level, the TrainSamples a node would build (sequence level: all; span: those that align)."""
    tok = learner_bundle.tokenizer()
    own_bytes = TokenBytes(tok)
    eos = learner_bundle.eos_token_ids[0]
    levels = {"sequence": [], "span": [], "token": []}
    n_unaligned = 0
    tokens_per_span = []
    for p, comps, rewards in groups:
        prompt_ids = learner_bundle.encode(learner_bundle.render_prompt(task.messages(p.question)))
        adv = group_advantages(torch.tensor(rewards)).tolist()
        for c, a in zip(comps, adv):
            ids = tok(c.text, add_special_tokens=False, split_special_tokens=True)["input_ids"]   # as a node does
            if c.finish_reason == "stop":
                ids = ids + [eos]
            if not ids:
                continue
            g = [float(x) for x in c.logprobs]
            levels["sequence"].append(TrainSample(prompt_ids, ids, None, float(sum(g)), a, sequence_level=True))
            if same_tokenizer:
                levels["token"].append(TrainSample(prompt_ids, list(c.token_ids), g, None, a))
            peer_lens = peer_bytes.lengths(c.token_ids, c.text)
            own_lens = own_bytes.lengths(ids, c.text)
            if peer_lens is None or own_lens is None:
                n_unaligned += 1
                continue
            own_span, peer_span, n = shared_spans(own_lens, peer_lens)
            levels["span"].append(TrainSample(prompt_ids, ids, None, float(sum(g)), a, span_ids=own_span,
                                              gen_span_logprobs=span_sums(peer_span, g, n)))
            tokens_per_span.append(len(ids) / n)
    return levels, n_unaligned, tokens_per_span


def level_stats(learner: Learner, samples: list[TrainSample], level: str) -> dict:
    """Weights and filter numbers of one level, from the real objective on the learner's log-probs."""
    rows = []
    with torch.no_grad():
        for i in range(0, len(samples), 4):
            batch = samples[i:i + 4]
            logp, mask = learner.logprobs(batch)
            gen, gen_sum, adv, lv, span_ids, gen_span = learner._objective_inputs(batch, logp.shape[1])
            _, st = ftis_loss(logp, gen, adv, mask, method="f-tis", C=C, kl_threshold=KL_G, level=level,
                              gen_logp_sum=gen_sum, span_ids=span_ids, gen_span_logp=gen_span,
                              num_samples=len(samples))
            ps = st["per_sample"]
            for b, s in enumerate(batch):
                l = logp[b][mask[b]].double()
                if level == "sequence":
                    units = [float(l.sum()) - s.gen_logprob_sum]
                elif level == "span":
                    L = np.zeros(len(s.gen_span_logprobs))
                    np.add.at(L, s.span_ids, l.numpy())
                    units = (L - np.array(s.gen_span_logprobs)).tolist()
                else:
                    units = (l.numpy() - np.array(s.gen_logprobs)).tolist()
                tok_w = np.minimum(np.exp(np.minimum(units, 10.0)), C)
                if level == "span":
                    tok_w = tok_w[s.span_ids]
                rows.append(dict(w=float(ps["is_weight"][b]), kl=float(ps["kl"][b]),
                                 dropped=bool(ps["dropped"][b]), units=units,
                                 truncated=float((np.asarray(tok_w) >= C).mean()) if level != "sequence"
                                 else float(units[0] >= np.log(C))))
    w = np.array([r["w"] for r in rows])
    ess = ess_fraction(w)
    units = [abs(u) for r in rows for u in r["units"]]
    return {
        "n": len(rows),
        "w_p10": float(np.quantile(w, 0.1)), "w_p50": float(np.median(w)), "w_p90": float(np.quantile(w, 0.9)),
        "w_mean": float(w.mean()),
        "w_zero": float((w < 1e-3).mean()),
        "trunc": statistics.fmean(r["truncated"] for r in rows),
        "ess": ess,
        "kl_gt_g": float(np.mean([r["kl"] > KL_G for r in rows])),
        "dropped": float(np.mean([r["dropped"] for r in rows])),
        "abs_lr": float(np.mean(units)),
        "units": len(units),
    }


def main() -> None:
    ap = parser(__doc__, result=False)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)     # rows appear as they are measured
    torch.set_num_threads(2)
    t0 = time.time()
    task = get_task("arith")
    stream = task.prompts(seed=args.seed)
    prompts = [next(stream) for _ in range(args.prompts)]
    bundles = {name: resolve_model(name) for name in ("smollm2-135m", "gemma3-270m")}
    token_bytes = {name: TokenBytes(b.tokenizer()) for name, b in bundles.items()}
    rollouts = {name: generate(b, task, prompts, args.group, args.max_new_tokens, args.seed)
                for name, b in bundles.items()}
    for name, groups in rollouts.items():
        comps = [c for _, cs, _ in groups for c in cs]
        print(f"# {name}: {len(comps)} completions, {sum(len(c.token_ids) for c in comps)} tokens, "
              f"mean reward {statistics.fmean(r for _, _, rs in groups for r in rs):.3f}")
    print(f"# C = {C}, kl_threshold g = {KL_G}; {args.prompts} arith prompts x {args.group}, "
          f"<= {args.max_new_tokens} new tokens, T = 1; {time.time() - t0:.0f} s so far")
    print()
    head = (f"{'generator -> learner':<30}{'level':<10}{'n':>4}{'w p10':>8}{'w p50':>8}{'w p90':>8}"
            f"{'w=0':>6}{'trunc':>7}{'ESS':>7}{'KL>g':>7}{'drop':>7}{'|lr|/unit':>11}{'units':>7}")
    print(head)
    pairs = [("gemma3-270m", "smollm2-135m"), ("smollm2-135m", "gemma3-270m"), ("smollm2-135m", "smollm2-135m")]
    learners = {}
    for gen_name, learn_name in pairs:
        if learn_name not in learners:
            learners[learn_name] = Learner(bundles[learn_name], trainable="lora", device="cpu", seed=0)
        same = gen_name == learn_name
        levels, unaligned, tps = samples_for(bundles[learn_name], task, rollouts[gen_name],
                                             token_bytes[gen_name], same)
        for level in ("sequence", "span", "token"):
            if not levels[level]:
                continue
            s = level_stats(learners[learn_name], levels[level], level)
            print(f"{gen_name + ' -> ' + learn_name:<30}{level:<10}{s['n']:>4}{s['w_p10']:>8.3f}{s['w_p50']:>8.3f}"
                  f"{s['w_p90']:>8.3f}{s['w_zero']:>6.2f}{s['trunc']:>7.3f}{s['ess']:>7.3f}{s['kl_gt_g']:>7.2f}"
                  f"{s['dropped']:>7.2f}{s['abs_lr']:>11.3f}{s['units']:>7}")
        if tps:
            print(f"{'':<30}(span level: {statistics.fmean(tps):.2f} learner tokens per span; "
                  f"{unaligned} completions not aligned -> sequence level)")
    print()
    print("w = per-sample mean truncated weight (as the loss uses it); w=0: share of samples with w < 1e-3;")
    print("trunc: share of tokens whose weight hit C; ESS = (sum w)^2 / (n sum w^2); KL>g: the filter's KL rule;")
    print("drop: dropped (KL > g and advantage <= 0); |lr|/unit: mean |log pi_learner - log pi_gen| per token /")
    print(f"span / sequence. Total {time.time() - t0:.0f} s (shared 2-core machine).")


if __name__ == "__main__":
    main()
