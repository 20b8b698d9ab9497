"""How much of an honest peer's text in another tokenizer a SmolLM2 learner keeps (issue 51 item 3).

The peer is Gemma 3 270M (llama.cpp, T = 1, the project's generator path) on the questions of
tests/data/real_rollouts.json (2 arith, 3 GSM8K), each asked as a node asks it (the task's
system prompt and its 2 worked examples, ``Task.messages``; in Gemma's chat format), so its
answers carry the task's template (<think> ... </think><answer> ... </answer>). Its rollouts are
a committed fixture, tests/data/gemma_rollouts.json (``--make-fixture`` writes it). The
receiver is a SmolLM2 LoRA learner that gets them as a node does (``batch.peer_samples``:
re-tokenized, span or sequence level, claimed foreign) and judges them in the real
``Learner.compute_gradients`` path, one Gemma group a step beside one own group (another
prompt's real SmolLM2 rollouts) that calibrates, with ONE repeat memory over all the steps as
a running node has. Every Gemma sample gets advantage +1 (the memories only apply to positive
samples: this is their most). No optimiser step is taken.

Reported for today's default (``default``: the weight bound alone, nothing masked or refused),
for the default until 2026-12-05 (``both``: the fixed threshold and the 3-gram / 8-gram repeat
memories, ``judge_foreign=True, foreign_memories=True``), and for each of its parts alone:
``judge`` (the threshold; ``foreign_memories=False`` keeps exactly what it keeps, the threshold
being computed before any memory) and ``memories`` (a threshold of -inf; run only when the
threshold refused a sample, else it equals ``both``): samples kept (not refused), samples with no
token masked, and the share of tokens kept (a refused sample's tokens all count as lost).
Target: >= 99 % of tokens and samples.

    python -m benchmarks.foreign_kept [--make-fixture [--per-prompt 8]] [--json PATH]
"""
from __future__ import annotations

import json
import math
import re
import time
from types import SimpleNamespace

import numpy as np

from benchmarks.harness import ROOT, parser, write_json
from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.peers.plausibility import PlausibilityConfig, RepeatMemory

OWN = ROOT / "tests" / "data" / "real_rollouts.json"
FIXTURE = ROOT / "tests" / "data" / "gemma_rollouts.json"
MAX_NEW = 128


def node_messages(smol, own: dict) -> list[list[dict]]:
    """The fixture's questions as a node asks them (system prompt and worked examples: the
    base ``Task.messages``, the same for arith and GSM8K; arith's needs no local data)."""
    from ftis_edge.tasks.registry import get_task
    task = get_task("arith")
    return [task.messages(re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", smol.decode(g["prompt_ids"]),
                                    re.S).group(1)) for g in own["groups"]]


def make_fixture(messages: list[list[dict]], per_prompt: int) -> dict:
    """Gemma 3 270M rollouts as a Gemma node publishes them (node._publish: token byte lengths)."""
    from benchmarks.plausibility_fp import sample
    from ftis_edge.rollout.align import TokenBytes
    from ftis_edge.models.resolve import resolve_model
    gemma = resolve_model("gemma3-270m")
    t0 = time.time()
    groups = sample("llamacpp", gemma, [gemma.encode(gemma.render_prompt(m)) for m in messages], per_prompt, 1.0,
                    threads=1)    # one thread: two spin on each other on a loaded machine
    g_bytes = TokenBytes(gemma.tokenizer())
    return {"model": "gemma3-270m (llama.cpp, q4_k_m)", "temperature": 1.0, "max_new_tokens": MAX_NEW,
            "generation_s": round(time.time() - t0, 1),
            "groups": [{"messages": m, "completions": [
                {"token_ids": [int(t) for t in c.token_ids], "logprobs": [round(float(x), 4) for x in c.logprobs],
                 "text": c.text, "finish_reason": c.finish_reason,
                 "token_bytes": [int(b) for b in g_bytes.lengths(c.token_ids, c.text)]}
                for c in comps if c.token_ids]} for m, comps in zip(messages, groups)]}


def received(smol, fixture: dict) -> list[list[TrainSample]]:
    """Per Gemma group, its samples as a SmolLM2 node receives them (advantage +1 each)."""
    from ftis_edge.rollout.align import TokenBytes
    from ftis_edge.learn.batch import LocalTokenizer, peer_samples
    from ftis_edge.peers.intake import PeerGroup
    from ftis_edge.rollout.wire import WireCompletion
    local = LocalTokenizer.of_bundle(smol, lambda msgs: smol.encode(smol.render_prompt(msgs)),
                                     max_completion_length=MAX_NEW, token_bytes=TokenBytes(smol.tokenizer()))
    out = []
    for g in fixture["groups"]:
        wire = [WireCompletion(np.array(c["token_ids"]), np.array(c["logprobs"], dtype=np.float32), c["text"], 0.0,
                               c["finish_reason"], np.array(c["token_bytes"])) for c in g["completions"]]
        p = PeerGroup(SimpleNamespace(node_id="gemma", completions=wire), g["messages"], [0.0] * len(wire), 0, False)
        out.append([s for s in peer_samples(p, [1.0] * len(wire), local) if s.completion_ids])
    return out


def measure(learner: Learner, own: list[list[TrainSample]], peer: list[list[TrainSample]],
            cfg: PlausibilityConfig) -> dict:
    """One Gemma group a step beside another prompt's own group; one memory over the steps."""
    learner.repeat_memory = RepeatMemory()
    d = dict(samples=0, kept=0, untouched=0, tokens=0, tokens_kept=0, masked_tokens=0, judge_tokens_kept=0)
    for k, group in enumerate(peer):
        calib = own[(k + 1) % len(own)]
        stats = learner.compute_gradients(calib + group, cfg)
        learner.optimizer.zero_grad(set_to_none=True)     # a backward ran; never a step
        imp, rep = stats["per_sample"]["implausible"], stats["per_sample"]["repeated"]
        for i, s in enumerate(group):
            j, n = len(calib) + i, len(s.completion_ids)
            refused, masked = bool(imp[j]), int(rep[j])
            d["samples"] += 1
            d["tokens"] += n
            d["kept"] += not refused
            d["untouched"] += not refused and masked == 0
            d["masked_tokens"] += masked
            d["tokens_kept"] += 0 if refused else n - masked
            d["judge_tokens_kept"] += 0 if refused else n
    return {**d, "kept_frac": round(d["kept"] / d["samples"], 4),
            "untouched_frac": round(d["untouched"] / d["samples"], 4),
            "tokens_kept_frac": round(d["tokens_kept"] / d["tokens"], 4)}


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--make-fixture", action="store_true", help=f"generate {FIXTURE.name} first")
    ap.add_argument("--per-prompt", type=int, default=8, help="Gemma rollouts per question (--make-fixture)")
    args = ap.parse_args(argv)
    from ftis_edge.models.resolve import resolve_model
    smol = resolve_model("smollm2-135m")
    own_fx = json.loads(OWN.read_text())
    if args.make_fixture:
        FIXTURE.write_text(json.dumps(make_fixture(node_messages(smol, own_fx), args.per_prompt)) + "\n")
    fixture = json.loads(FIXTURE.read_text())
    own = [[TrainSample(g["prompt_ids"], c["token_ids"], c["logprobs"], None, 0.0) for c in g["completions"]]
           for g in own_fx["groups"]]
    peer = received(smol, fixture)
    learner = Learner(smol.hf_dir(), trainable="lora", seed=0, micro_batch=8)
    result = {"levels": sorted({s.level for g in peer for s in g}),
              "stopped": sum(c["finish_reason"] == "stop" for g in fixture["groups"] for c in g["completions"]),
              "arms": {}}
    both = measure(learner, own, peer, PlausibilityConfig(judge_foreign=True, foreign_memories=True))
    judge = {k: both[k] for k in ("samples", "kept", "tokens", "kept_frac")}
    judge.update(untouched=both["kept"], tokens_kept=both["judge_tokens_kept"],
                 untouched_frac=both["kept_frac"], tokens_kept_frac=round(both["judge_tokens_kept"] / both["tokens"], 4))
    result["arms"] = {"judge": judge, "both": both}
    if both["kept"] < both["samples"]:      # a refused sample is not taught: the memories alone may mask more
        result["arms"]["memories"] = measure(learner, own, peer, PlausibilityConfig(
            judge_foreign=True, foreign_memories=True, foreign_threshold=-math.inf))
    else:
        result["arms"]["memories"] = both
    result["arms"]["default"] = measure(learner, own, peer, PlausibilityConfig())   # the bound alone
    write_json(args.json, result)
    print("levels:", result["levels"], "| stopped:", result["stopped"])
    for arm, r in result["arms"].items():
        print(f"{arm:>9}: samples kept {r['kept']}/{r['samples']} ({r['kept_frac']:.1%}), with no token masked "
              f"{r['untouched']}/{r['samples']}; tokens kept {r['tokens_kept']}/{r['tokens']} "
              f"({r['tokens_kept_frac']:.1%})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
