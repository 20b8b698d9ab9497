"""False positives of the plausibility filter on real honest peer rollouts (issue 25, hole 1).

The receiver is a fresh SmolLM2 LoRA learner. Each "step" calibrates on one own group (8 real
SmolLM2 llama.cpp rollouts at T = 1, tests/data/real_rollouts.json) and judges honest peer
samples through the real ``Learner.compute_gradients`` path (advantages 0, so no backward):

* ``smollm2``: the fixture's other groups — another SmolLM2 node (llama.cpp, T = 1);
* ``hf_t0.7``: completions sampled here by the HF backend (the full-fine-tuning setup's
  generator) at T = 0.7, top-p 1, on the same prompts.

Each own group (up to --calibrations) takes its turn as the calibration. Prints the fraction of peer samples that
keep their usual weight, per kind (target: >= 99%).

    python benchmarks/plausibility_fp.py [--hf-per-prompt 8] [--calibrations 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ftis_edge.learner import Learner, TrainSample  # noqa: E402
from ftis_edge.plausibility import PlausibilityConfig  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "real_rollouts.json"


def hf_groups(bundle, prompts: list[list[int]], n: int, temperature: float) -> list[list[TrainSample]]:
    from ftis_edge.generate.base import SamplerSettings
    from ftis_edge.generate.registry import create_generator
    gen = create_generator("hf", bundle)
    out = []
    for k, p in enumerate(prompts):
        comps = gen.generate(p, n, SamplerSettings(temperature=temperature, max_new_tokens=128, seed=k))
        out.append([TrainSample(p, c.token_ids, c.logprobs, None, 0.0, source="hf") for c in comps if c.token_ids])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-per-prompt", type=int, default=8)
    ap.add_argument("--calibrations", type=int, default=5, help="own groups that take a turn as calibration")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from ftis_edge.models import resolve_model
    bundle = resolve_model("smollm2-135m")
    fx = json.loads(FIXTURE.read_text())
    own = [[TrainSample(g["prompt_ids"], c["token_ids"], c["logprobs"], None, 0.0) for c in g["completions"]]
           for g in fx["groups"]]
    t0 = time.time()
    hf = hf_groups(bundle, [g["prompt_ids"] for g in fx["groups"]], args.hf_per_prompt, args.temperature) \
        if args.hf_per_prompt else []
    t_gen = time.time() - t0
    learner = Learner(bundle.hf_dir(), trainable="lora", seed=0, micro_batch=8)
    cfg = PlausibilityConfig()
    judged = {"smollm2": [0, 0], f"hf_t{args.temperature}": [0, 0]}   # [kept, judged]
    thresholds = []
    for k, calib in enumerate(own[:args.calibrations]):
        peers = [("smollm2", TrainSample(s.prompt_ids, s.completion_ids, s.gen_logprobs, None, 0.0, source="peer"))
                 for j, g in enumerate(own) if j != k for s in g]
        peers += [(f"hf_t{args.temperature}", s) for g in hf for s in g]
        batch = calib + [s for _, s in peers]
        stats = learner.compute_gradients(batch, cfg)
        imp = stats["per_sample"]["implausible"]
        thresholds.append(stats["trust/threshold"])
        for i, (kind, _) in enumerate(peers):
            judged[kind][0] += not bool(imp[len(calib) + i])
            judged[kind][1] += 1
    result = {"thresholds": [round(t, 3) for t in thresholds], "generation_s": round(t_gen, 1),
              **{kind: {"kept": kept, "judged": n, "kept_frac": round(kept / n, 4) if n else None}
                 for kind, (kept, n) in judged.items()}}
    if args.json:
        print(json.dumps(result))
    else:
        print("thresholds per calibration group:", result["thresholds"])
        for kind, (kept, n) in judged.items():
            if n:
                print(f"{kind:>10}: {kept}/{n} honest peer samples keep their weight ({kept / n:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
