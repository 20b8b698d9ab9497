"""How much of two honest peers' text in another tokenizer a SmolLM2 learner keeps over a run, under
the bounds on what such text moves (issue 62 item 2: ``train.other_tokenizer`` opted in).

The honest text is real Gemma 3 270M text on the task the nodes train (arith), from H9 seed 0's
committed evals (docs/runs/h9/h9/s0/*/eval-id.json.gz): peer A answers prompts as node 3's three
arms (kin, any, alone) answered them, from the first, peer B as node 4's did, from the 80th (5 of
B's first 60 prompts are among A's, asked at other steps); a group is one prompt's three answers, rewarded by the
eval's grading, and only groups with signal are sent (a group without one trains nothing): 164 and
133 of them, so 60 steps ask 60 new questions of each. Each answer differs from its group-mates and every
step asks a new question, as an honest peer's groups do. Each step the receiver trains on an own
group of 4 (real SmolLM2 rollouts, as ``attacks.poison_foreign``) and one group from each peer,
re-tokenized and claimed foreign, through the node's own path: ``ForeignBudget`` on the batch, the
IS weight capped at 1, and ``ForeignDirection`` on the step (``Learner.step(apart=)``); LoRA, lr
1e-4, f-tis. A proxy, said plainly: three checkpoints' greedy answers stand in for one model's
samples at T = 1.

Reported per peer: the share of its pull the budget lets in (weight after / before, x |advantage|),
the share of its gradient the direction bound lets in (sum of s |g| / sum of |g|), their product,
and the largest |D_p| / R over the run (what the direction bound compares with its budget), the
kind's largest |K| / R, and both every 10 steps (``trace``);
``--peer-budget`` / ``--kind-budget`` override the defaults (1e9: unbounded, to see the sums);
``--distinct-peers 2`` counts the two peers as told apart by key (named on a CURVE relay), else
they share one peer's budget.
Target: >= 99 % of honest text kept.

    python -m benchmarks.foreign_honest_stream [--steps 60] [--peer-budget X] [--kind-budget X] [--distinct-peers N] [--json PATH]
"""
from __future__ import annotations

import gzip
import json
import time

import torch

from benchmarks.attacks.poison import Setup
from benchmarks.harness import ROOT, parser, write_json
from ftis_edge.learn.batch import learner_factors
from ftis_edge.learn.foreign_budget import ForeignBudget
from ftis_edge.learn.foreign_direction import ForeignDirection, flat
from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.learn.objective import group_advantages
from ftis_edge.peers.plausibility import PlausibilityConfig

RUNS = ROOT / "docs" / "runs" / "h9" / "h9" / "s0"
PEERS = {"gemma-a": ("3", 0), "gemma-b": ("4", 80)}      # the node each peer speaks for, its first group
ARMS = ("kin", "any", "alone")
STOP = "\n\nUser:"


def honest_groups(node: str, which: str = "id") -> list[dict]:
    """One prompt's answers by node NODE's three arms, in prompt order, only those with signal."""
    evals = [json.load(gzip.open(RUNS / f"{arm}-{node}" / f"eval-{which}.json.gz", "rt")) for arm in ARMS]
    by_id = [{it["id"]: it for it in e["items"]} for e in evals]
    out = []
    for pid in [it["id"] for it in evals[0]["items"]]:
        items = [b[pid] for b in by_id if pid in b]
        rewards = [float(it["correct"]) for it in items]
        if len(items) == len(ARMS) and 0 < sum(rewards) < len(rewards):
            out.append({"id": pid, "texts": [it["text"].removesuffix(STOP) for it in items], "rewards": rewards})
    return out


class Stream:
    def __init__(self, setup: Setup):
        from ftis_edge.tasks.registry import get_task
        self.setup, self.task = setup, get_task("arith")
        self.groups = {}
        for p, (node, first) in PEERS.items():
            groups = honest_groups(node)
            self.groups[p] = groups[first:] + groups[:first]

    def peer_group(self, learner: Learner, peer: str, step: int) -> list[TrainSample]:
        g = self.groups[peer][step % len(self.groups[peer])]
        b = self.setup.bundle
        prompt = b.encode(b.render_prompt(self.task.messages(self.task.get(g["id"]).question)))
        comps = [self.setup.ids(t) + [self.setup.eos] for t in g["texts"]]
        adv = group_advantages(torch.tensor(g["rewards"])).tolist()
        base = [TrainSample(prompt, ids, None, 0.0, 0.0, sequence_level=True) for ids in comps]
        with torch.no_grad():
            logp, mask = learner.logprobs(base)
        return [TrainSample(prompt, s.completion_ids, None, float(logp[i][mask[i]].sum()), a, sequence_level=True,
                            source=peer, foreign=True) for i, (s, a) in enumerate(zip(base, adv))]


def summary(per: dict) -> dict:
    out = {}
    for p, d in per.items():
        pull = d["pull_in"] / d["pull_offered"] if d["pull_offered"] else 1.0
        grad = d["grad_in"] / d["grad_offered"] if d["grad_offered"] else 1.0
        cos = d["cos_with_sum"]
        out[p] = {"budget_kept": round(pull, 4), "direction_kept": round(grad, 4), "kept": round(pull * grad, 4),
                  "max_sum_over_R": round(d["max_sum_over_R"], 3),
                  "mean_cos_with_its_sum": round(sum(cos) / len(cos), 3) if cos else None}
    return out


SHADOW_HORIZONS = (10, 20, 30, 50)


class WatchedDirection(ForeignDirection):
    """The bound, also keeping (1) the decayed sum of the rest of the step (the node's own
    gradient), to see whether an honest peer's persistent push points where the node's own text
    pushes, and (2) each peer's and the kind's applied sums under other horizons, each against its
    own R, to see the largest |D| / R a budget at that horizon would have to admit."""
    own = None
    seen = None
    shadow = None

    def decide(self, rest, grads):
        self.seen = flat(rest)
        return super().decide(rest, grads)

    def commit(self):
        pend = self.pending
        if pend is not None:
            self.own = self.seen if self.own is None else self.gamma * self.own + self.seen
            applied = {p: pend["scale"][p] * v for p, v in pend["vec"].items()}
            self.shadow = self.shadow or {h: {"sums": {}, "kind": None, "ref": 0.0, "w": 0.0, "max": {}}
                                          for h in SHADOW_HORIZONS}
            for h, sh in self.shadow.items():
                g = 1.0 - 1.0 / h
                sh["ref"], sh["w"] = g * sh["ref"] + pend["rest_norm"], g * sh["w"] + 1.0
                R = sh["ref"] / sh["w"]
                for p in sh["sums"]:
                    sh["sums"][p] = g * sh["sums"][p]
                for p, v in applied.items():
                    sh["sums"][p] = sh["sums"].get(p, torch.zeros_like(v)) + v
                total = sum(applied.values())
                sh["kind"] = total if sh["kind"] is None else g * sh["kind"] + total
                if R:
                    for p, d in [*sh["sums"].items(), ("kind", sh["kind"])]:
                        sh["max"][p] = max(sh["max"].get(p, 0.0), float(d.norm()) / R)
        super().commit()

    def shadow_maxima(self) -> dict:
        """Per horizon: each peer's and the kind's largest |D| / R so far."""
        return {h: {p: round(x, 3) for p, x in sh["max"].items()} for h, sh in (self.shadow or {}).items()}

    def against_own(self, p: str, R: float) -> dict:
        """cos(D_p, own sum) and |D_p off the own sum's line| / R."""
        d, o = self.sums.get(p), self.own
        if d is None or o is None or not R or not float(o.norm()) or not float(d.norm()):
            return {}
        u = o / o.norm()
        along = float(d @ u)
        return {"cos_with_own": round(along / float(d.norm()), 3),
                "off_own_over_R": round(float((d - along * u).norm()) / R, 3)}


def run(setup: Setup, steps: int, direction: ForeignDirection, lr: float = 1e-4, partial=None) -> dict:
    """``partial(result so far)`` every 10 steps: a run cut short keeps what it measured."""
    learner = Learner(setup.bundle.hf_dir(), trainable="lora", lr=lr, seed=0, micro_batch=8)
    stream, budget, plausible = Stream(setup), ForeignBudget(), PlausibilityConfig()
    per = {p: {"pull_in": 0.0, "pull_offered": 0.0, "grad_in": 0.0, "grad_offered": 0.0, "max_sum_over_R": 0.0,
               "cos_with_sum": []} for p in PEERS}
    t0, trace, kind_max = time.time(), [], 0.0
    for step in range(steps):
        batch = setup.own_group(step) + [s for p in PEERS for s in stream.peer_group(learner, p, step)]
        factors = learner_factors(batch, plausible)
        bounded = budget.apply(batch, factors)
        for s0, s1, f in zip(batch, bounded, factors):
            if s0.source in per:
                per[s0.source]["pull_offered"] += abs(s0.advantage) * s0.weight * f
                per[s0.source]["pull_in"] += abs(s1.advantage) * s1.weight * f
        learner.step(bounded, plausible=plausible, apart=direction, method="f-tis", foreign_cap=1.0)
        R = direction.ref / direction.ref_weight if direction.ref_weight else 0.0
        last = direction.last
        for p in PEERS:
            if p not in last.get("vec_norm", {}):
                continue
            g = last["vec_norm"][p]
            per[p]["grad_offered"] += g
            per[p]["grad_in"] += last["scale"][p] * g
            if p in direction.sums and R:
                per[p]["max_sum_over_R"] = max(per[p]["max_sum_over_R"], float(direction.sums[p].norm()) / R)
            if p in last["cos"]:
                per[p]["cos_with_sum"].append(last["cos"][p])
        if direction.kind is not None and R:
            kind_max = max(kind_max, float(direction.kind.norm()) / R)
        if (step + 1) % 10 == 0:
            trace.append({"step": step + 1, "seconds": round(time.time() - t0, 1),
                          "kind_over_R": round(float(direction.kind.norm()) / R, 3) if R else None,
                          "max_kind_over_R": round(kind_max, 3),
                          **{p: {"sum_over_R": round(float(direction.sums[p].norm()) / R, 3) if p in direction.sums
                                 and R else None, "max_sum_over_R": round(per[p]["max_sum_over_R"], 3),
                                 "scale": round(last["scale"].get(p, 1.0), 3),
                                 **(direction.against_own(p, R) if isinstance(direction, WatchedDirection) else {})}
                             for p in PEERS}})
            print(json.dumps(trace[-1]), flush=True)
            if partial is not None:
                partial({"steps_done": step + 1, "steps": steps, "peers": summary(per), "trace": trace,
                         **shadow(direction)})
    out = summary(per)
    return {"steps_done": steps, "steps": steps, "peer_budget": direction.peer_budget, "kind_budget": direction.kind_budget,
            "distinct_peers": direction.distinct_peers, "kind_room": direction.kind_room,
            "horizon": direction.horizon, "peers": out, "max_kind_over_R": round(kind_max, 3), "trace": trace,
            "seconds": round(time.time() - t0, 1), **shadow(direction)}


def shadow(direction) -> dict:
    return {"max_over_R_by_horizon": direction.shadow_maxima()} if isinstance(direction, WatchedDirection) else {}


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--peer-budget", type=float, default=None)
    ap.add_argument("--kind-budget", type=float, default=None)
    ap.add_argument("--distinct-peers", type=int, default=0,
                    help="peers told apart by key (named on a CURVE relay); 0: ids are claims, the kind is one peer")
    args = ap.parse_args(argv)
    direction = WatchedDirection(distinct_peers=args.distinct_peers)
    if args.peer_budget is not None:
        direction.peer_budget = args.peer_budget
    if args.kind_budget is not None:
        direction.kind_budget = args.kind_budget
    setup = Setup(" unused")
    r = run(setup, args.steps, direction, partial=lambda part: write_json(args.json, part))
    write_json(args.json, r)
    for p, d in r["peers"].items():
        print(f"{p}: budget kept {d['budget_kept']:.1%}, direction kept {d['direction_kept']:.1%}, together "
              f"{d['kept']:.1%}; largest |D|/R {d['max_sum_over_R']}, mean cos(g, D) {d['mean_cos_with_its_sum']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
