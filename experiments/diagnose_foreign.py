"""What the node that differs trains on: IS weights, KL and lengths of its peers' samples, against
its held-out accuracy (docs/results.md, "Why the Gemma node drifts").

    .venv/bin/python -m experiments.diagnose_foreign committed [--runs docs/runs/fill/fill-hetero/s0] [--arms ftis-3 ...]
    .venv/bin/python -m experiments.diagnose_foreign fresh [--groups 12 --steps 4 --eval-prompts 64]
        [--json docs/runs/diagnose-foreign.json]

``committed`` reads the H5 round records of the Gemma node (arms ftis and nois, and its twin
alone). A round record holds the whole batch's stats; the peer-only numbers come from the
cumulative per-peer book in each record (``peers``: samples used, mean KL, mean IS weight, filter
rate), differenced round by round. Rounds are shown in blocks of four.

``fresh`` runs the real models: SmolLM2 (llama.cpp, as a node generates: T = 1, 64 tokens,
groups of 8) answers training prompts of the H5 task; the Gemma 3 learner (LoRA as H5's Gemma
node: r 8, lr 2e-4, f-tis, C = 2, g = 5) trains on three of those peer groups a step, built by
the node's own ``build_batch``, from the same start in two arms: today's F-TIS and F-TIS with
the protections for another model's samples (the config defaults: IS cap 1, length rule,
success floor 0.5). Peer-only batches, as 24 of the H5 Gemma node's 32 rounds were (its own
group had no signal). Per step and arm: the peer samples' IS weights, KL and lengths by the
sign of their advantage; after the last step, the first step's positive samples are scored
again (does imitating them raise their weight?); greedy held-out accuracy of the base and of
each arm's final weights on the first N prompts of the eval split (the node's own eval:
heldout.HeldOut on the live policy), with Wilson intervals and the paired change.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

from experiments.repro import records  # (published records: plain or gzip-compressed)

ROOT = Path(__file__).resolve().parent.parent

H5 = ROOT / "docs" / "runs" / "fill" / "fill-hetero" / "s0"


# --------------------------------------------------------------------------- committed records

def peer_rounds(run: Path) -> list[dict]:
    """Per round: the batch's stats and the peer-only numbers differenced from the cumulative book."""
    rows, prev = [], {}
    for r in records.metrics(run):
        if r.get("type") != "round":
            continue
        n = kl = w = dropped = 0.0
        for node, p in (r.get("peers") or {}).items():
            used, before = p.get("samples_used") or 0, prev.get(node, {})
            used0 = before.get("samples_used") or 0
            if used > used0:
                n += used - used0
                kl += (p.get("kl_mean") or 0) * used - (before.get("kl_mean") or 0) * used0
                w += (p.get("is_weight_mean") or 0) * used - (before.get("is_weight_mean") or 0) * used0
                dropped += (p.get("filter_rate") or 0) * used - (before.get("filter_rate") or 0) * used0
        prev = {k: dict(v) for k, v in (r.get("peers") or {}).items()}
        rows.append(dict(round=r["round"], own=r.get("samples/own") or 0, peer=n, dropped=round(dropped),
                         kl_gt_g=r.get("filter/kl_gt_g") or 0, w_sum=w, kl_sum=kl,
                         trunc=r.get("is/truncated_frac"), tokens=r.get("tokens") or 0,
                         reward=r.get("reward/own"), format=r.get("format/own"),
                         length=r.get("completions/mean_length")))
    return rows


def blocks(rows: list[dict], size: int = 4) -> list[dict]:
    out = []
    for i in range(0, len(rows), size):
        b = rows[i:i + size]
        peer = sum(r["peer"] for r in b)
        tok = sum(r["tokens"] for r in b)
        out.append(dict(
            rounds=f"{b[0]['round']}–{b[-1]['round']}",
            own=sum(r["own"] for r in b), peer=int(peer),
            dropped=sum(r["dropped"] for r in b),
            # own samples are on-policy (KL ≈ 0): every sample over g is a peer's
            kl_share=sum(r["kl_gt_g"] for r in b) / peer if peer else None,
            w=sum(r["w_sum"] for r in b) / peer if peer else None,
            trunc=sum((r["trunc"] or 0) * r["tokens"] for r in b) / tok if tok else None,
            reward=statistics.fmean(r["reward"] for r in b if r["reward"] is not None),
            format=statistics.fmean(r["format"] for r in b if r["format"] is not None),
            length=statistics.fmean(r["length"] for r in b if r["length"] is not None)))
    return out


def _eval(run: Path, name: str) -> str:
    d = records.eval_of(run, name)
    if d is None:
        return "–"
    acc = d.get("accuracy", d.get("summary", {}).get("accuracy"))
    return f"{acc:.3f}" if isinstance(acc, (int, float)) else "–"


def committed(runs: Path, arms=("ftis-3", "nois-3", "alone-3")) -> None:
    fmt = lambda v, f: "–" if v is None else format(v, f)   # noqa: E731
    for arm in arms:
        run = runs / arm
        rows = peer_rounds(run)
        print(f"\n{arm}: held-out greedy accuracy of the final weights ID {_eval(run, 'id')}, OOD {_eval(run, 'ood')}")
        print("| rounds | own samples | peer samples | peer trained | peer Â ≤ 0 dropped (KL > g) | peers with KL > g | "
              "peer IS weight (mean) | tokens at C | own reward | own format | own length |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for b in blocks(rows):
            print(f"| {b['rounds']} | {b['own']} | {b['peer']} | {b['peer'] - b['dropped']} | {b['dropped']} | "
                  f"{fmt(b['kl_share'], '.2f')} | "
                  f"{fmt(b['w'], '.3f')} | {fmt(b['trunc'], '.3f')} | {b['reward']:.2f} | {b['format']:.2f} | "
                  f"{b['length']:.1f} |")


# --------------------------------------------------------------------------- fresh rollouts

def fresh(args) -> dict:
    import numpy as np
    import torch

    from ftis_edge import config as config_mod
    from ftis_edge.rollout.align import TokenBytes
    from ftis_edge.learn.batch import LocalTokenizer, SampleRules, build_batch
    from ftis_edge.generate.base import GeneratorOptions, SamplerSettings
    from ftis_edge.generate.registry import create_generator
    from ftis_edge.run.heldout import HeldOut
    from ftis_edge.metrics.stats import paired_change
    from ftis_edge.peers.intake import PeerGroup
    from ftis_edge.learn.learner import Learner
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.tasks.base import Prompt
    from ftis_edge.tasks.registry import task_from_config
    from ftis_edge.rollout.wire import Rollout, WireCompletion

    torch.set_num_threads(args.threads)
    t0 = time.time()
    cfg = config_mod.load(H5 / "ftis-3" / "config.toml")
    task = task_from_config(cfg.task)
    budget = cfg.task.max_completion_length
    smol, gemma = resolve_model("smollm2-135m"), resolve_model("gemma3-270m")
    smol_bytes, gemma_bytes = TokenBytes(smol.tokenizer()), TokenBytes(gemma.tokenizer())

    # SmolLM2's groups, as its node generates and publishes them (kept in --rollouts: a rerun reuses them)
    saved = json.loads(args.rollouts.read_text()) if args.rollouts and args.rollouts.is_file() else []
    if len(saved) < args.groups:
        saved = []
        gen = create_generator("llamacpp", smol, GeneratorOptions(precision="f16", threads=args.threads,
                                                                   max_group=8))
        stream = task.prompts(seed=args.seed)
        try:
            while len(saved) < args.groups:
                p = next(stream)
                ids = smol.encode(smol.render_prompt(task.messages(p.question)))
                comps = gen.generate(ids, 8, SamplerSettings(temperature=cfg.task.temperature, max_new_tokens=budget,
                                                             seed=args.seed + len(saved)))
                rewards = [float(r) for r, _ in task.reward_many([c.text for c in comps], [p.reference] * 8)]
                if max(rewards) == min(rewards):
                    continue        # intake takes informative groups first: the ones a node trains on
                saved.append(dict(prompt=dict(id=p.id, question=p.question, reference=p.reference),
                                  rewards=rewards, completions=[
                                      dict(token_ids=list(map(int, c.token_ids)), logprobs=list(map(float, c.logprobs)),
                                           text=c.text, finish_reason=c.finish_reason) for c in comps]))
                print(f"# SmolLM2 group {len(saved)}: rewards {rewards}", flush=True)
        finally:
            gen.close()
        if args.rollouts:
            args.rollouts.write_text(json.dumps(saved))
    peers = []
    for g in saved[:args.groups]:
        p = Prompt(**g["prompt"])
        wire = [WireCompletion(token_ids=np.array(c["token_ids"], dtype=np.int64),
                               logprobs=np.array(c["logprobs"], dtype=np.float32), text=c["text"], reward=r,
                               finish_reason=c["finish_reason"],
                               token_bytes=smol_bytes.lengths(c["token_ids"], c["text"]))
                for c, r in zip(g["completions"], g["rewards"])]
        rollout = Rollout(rollout_id=f"smol-{p.id}", node_id="node-0", swarm="s", task="arith", prompt_id=p.id,
                          prompt_ids=None, group_id=f"node-0:1:{p.id}", group_index=0, group_size=8, round=1,
                          completions=wire, model_fp=smol.fingerprint, tokenizer_fp=smol.tokenizer_fingerprint,
                          model_name="smollm2-135m", vocab_size=smol.vocab_size, temperature=1.0, top_k=0,
                          top_p=1.0, adapter_version=0, sent_at=0.0)
        peers.append(PeerGroup(rollout=rollout, prompt=p, rewards=g["rewards"], arrived_round=1, same_tokenizer=False))
    gen_s = time.time() - t0
    print(f"# SmolLM2: {len(peers)} informative groups of 8 ({gen_s:.0f} s); "
          f"mean reward {statistics.fmean(r for p in peers for r in p.rewards):.3f}", flush=True)

    local = LocalTokenizer.of_bundle(gemma, lambda q: gemma.encode(gemma.render_prompt(task.messages(q.question))),
                                     max_completion_length=budget, token_bytes=gemma_bytes)
    t = cfg.train
    learner = Learner(gemma, trainable="lora", lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                      lora_targets=tuple(gemma.lora_targets(t.lora_targets)), lr=2e-4, seed=0, device="cpu",
                      micro_batch=8)
    start = copy.deepcopy(learner.state_dict())
    policy = create_generator("hf", gemma, GeneratorOptions(policy=learner.model, threads=args.threads))
    heldout = HeldOut(task, gemma, policy, every=1, prompts=args.eval_prompts, max_new_tokens=budget)
    base = heldout.run(0) if heldout.active else None      # --eval-prompts 0: weights and KL only
    if base is not None:
        print(f"# Gemma base held-out: {base.accuracy:.3f} on {base.n} ({base.seconds:.0f} s)", flush=True)

    arms = {
        "f-tis (today)": (SampleRules(model_fp=gemma.fingerprint), None),
        "f-tis + protections": (SampleRules(model_fp=gemma.fingerprint, foreign_length_rule=t.foreign_length_rule,
                                            foreign_success_floor=t.foreign_success_floor,
                                            mask_truncated_completions=t.mask_truncated_completions),
                                t.foreign_is_cap or None),
    }
    out = {"groups": len(peers), "generation_s": gen_s, "base": base and base.as_dict(), "arms": {}}
    for arm, (rules, cap) in arms.items():
        learner.load_state_dict(copy.deepcopy(start))
        steps, first_pos = [], None
        for k in range(args.steps):
            group = [peers[(k * args.per_step + j) % len(peers)] for j in range(args.per_step)]
            batch = build_batch([], group, mode="vertical", scale=t.advantage_scale, local=local, rules=rules)
            st = learner.step(batch.samples, method=t.method, C=t.C, eps=t.epsilon, kl_threshold=t.kl_threshold,
                              foreign_cap=cap)
            ps = st["per_sample"]
            rows = []
            for i, s in enumerate(batch.samples):
                rows.append(dict(adv=s.advantage, tokens=len(s.completion_ids), w=float(ps["is_weight"][i]),
                                 kl=float(ps["kl"][i]), dropped=bool(ps["dropped"][i]), weight=s.weight,
                                 capped=bool(ps["capped"][i]) if "capped" in ps else False))
            if k == 0:
                first_pos = [s for s in batch.samples if s.advantage > 0]
            steps.append(dict(step=k + 1, samples=rows, refused_length=batch.refused_length,
                              success_weight=batch.success_weight, skipped=st.get("skipped")))
            _print_step(arm, steps[-1])
        with torch.no_grad():   # the first step's positive texts, re-scored by the trained learner
            again = learner.compute_gradients(first_pos, method="f-tis", C=t.C, kl_threshold=t.kl_threshold)
        learner.optimizer.zero_grad(set_to_none=True)
        w_after = again["per_sample"]["is_weight"].tolist()
        w_before = [r["w"] for r in steps[0]["samples"] if r["adv"] > 0]
        out["arms"][arm] = dict(steps=steps, first_positive_w_before=w_before, first_positive_w_after=w_after)
        print(f"# {arm}: first step's positive samples, IS weight {statistics.fmean(w_before):.3f} at step 1 -> "
              f"{statistics.fmean(w_after):.3f} after {args.steps} steps (plain F-TIS weight, C = {t.C})", flush=True)
        if base is None:
            continue
        res = heldout.run(args.steps)
        ch = paired_change(res.correct, base.correct)
        out["arms"][arm].update(eval=res.as_dict(), change=ch.change, change_se=ch.se)
        lo, hi = res.interval
        print(f"# {arm}: held-out {res.accuracy:.3f} [{lo:.3f}, {hi:.3f}], format {statistics.fmean(res.format_ok):.2f},"
              f" cut {statistics.fmean(res.truncated):.2f}; paired change vs base {ch.change:+.3f} ± {ch.se:.3f}",
              flush=True)
    out["seconds"] = time.time() - t0
    print(f"# total {out['seconds']:.0f} s")
    return out


def _print_step(arm: str, step: dict) -> None:
    rows = step["samples"]
    for sign, pick in (("Â>0", lambda r: r["adv"] > 0), ("Â≤0", lambda r: r["adv"] <= 0)):
        sel = [r for r in rows if pick(r)]
        if not sel:
            continue
        kl = sorted(r["kl"] for r in sel)
        print(f"{arm:<22} step {step['step']} {sign}: n {len(sel):>2}  trained {sum(not r['dropped'] for r in sel):>2}"
              f"  IS w {statistics.fmean(r['w'] for r in sel):.3f}  capped {sum(r['capped'] for r in sel):>2}"
              f"  KL median {kl[len(kl) // 2]:.2f}  KL>g {sum(k > 5 for k in kl):>2}"
              f"  tokens {statistics.fmean(r['tokens'] for r in sel):.1f}  weight {statistics.fmean(r['weight'] for r in sel):.2f}"
              f"  refused(len) {step['refused_length']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("committed")
    c.add_argument("--runs", type=Path, default=H5)
    c.add_argument("--arms", nargs="+", default=["ftis-3", "nois-3", "alone-3"], help="run directories under --runs "
                   "(H6: protect-3 ftis-3 alone-3)")
    f = sub.add_parser("fresh")
    f.add_argument("--groups", type=int, default=12)
    f.add_argument("--steps", type=int, default=4)
    f.add_argument("--per-step", type=int, default=3)
    f.add_argument("--eval-prompts", type=int, default=64)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--json", type=Path, default=None)
    f.add_argument("--rollouts", type=Path, default=None, help="SmolLM2's groups: written once, then reused")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.cmd == "committed":
        committed(args.runs, args.arms)
    else:
        out = fresh(args)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
