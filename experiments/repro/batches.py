"""The reproduction's experiments, as data: one *batch* = one heterogeneous peer + the nodes that learn from it.

Every batch runs one peer that shares its rollouts and several *receivers* that learn from
them (`swarm.share = false`, so receivers never see each other). All receivers of a batch
therefore get the same peer stream in the same rounds, and differ only in what the batch
compares (method, KL threshold, collaboration mode). Receivers are SmolLM2-135M with LoRA,
generating with llama.cpp, like the default node; the peer is the heterogeneous part.

The one-way flow is a simplification of the paper's all-to-all exchange (2 nodes that both
train on each other's groups); it keeps the peer's data identical across the compared
methods, which is what makes a 3-seed comparison on a 2-core CPU meaningful at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Shared by every node: the smallest setting in which the default node still learns in ~10 rounds.
COMMON = {
    "node": {"checkpoint_every": 100},
    # exact micro-batching keeps each process near 1.5 GB; another tokenizer's text trained, with no
    # budget on what it moves, as when H6-H8 were registered and run (issues 65 and 62 changed both)
    "train": {"micro_batch": 2, "other_tokenizer": True, "foreign_budget": False},
    "model": {"threads": 1},
    "task": {"name": "arith", "prompts_per_round": 2, "num_generations": 8, "max_completion_length": 64},
}
RECEIVER = {
    "model": {"spec": "smollm2-135m", "backend": "llamacpp", "precision": "f16"},
    "train": {"trainable": "lora", "learning_rate": 2e-4},
    # Wait for the peer (it sets the pace), take both of its groups, tolerate it being ahead.
    # own_groups 0: the reproduction's receivers generate all their groups, peers' come on top
    "swarm": {"share": False, "max_wait_s": 600.0, "max_peer_groups": 2, "max_staleness": 4, "own_groups": 0},
}
PEER = {"swarm": {"share": True, "max_peer_groups": 0, "max_wait_s": 0.0, "own_groups": 0}}

# The heterogeneous peers. The main one differs from the receivers in what is trained (all
# weights), the engine (HF transformers from live weights) and the sampling temperature (0.7):
# its samples are genuinely off-policy for a T = 1 LoRA learner, at the token level.
SMOL_FULL_HF_T07 = {"model": {"spec": "smollm2-135m", "backend": "hf"},
                    "train": {"trainable": "full", "learning_rate": 1e-5}, "task": {"temperature": 0.7}}
SMOL_FULL = {"model": {"spec": "smollm2-135m", "backend": "llamacpp", "precision": "f16"},
             "train": {"trainable": "full", "learning_rate": 1e-5}}
SMOL_LORA_HF = {"model": {"spec": "smollm2-135m", "backend": "hf"},
                "train": {"trainable": "lora", "learning_rate": 2e-4}}
GEMMA_LORA = {"model": {"spec": "gemma3-270m", "backend": "llamacpp", "precision": "f16"},
              "train": {"trainable": "lora", "learning_rate": 2e-4}}


def merge(*parts: dict) -> dict:
    """Deep-merge config dicts (later wins)."""
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


@dataclass
class Expert:
    """A peer trained alone first (once, seed 0, in OUT/experts/NAME), then sharing: every seed
    of its batch starts its peer from a copy of the expert's last checkpoint."""
    name: str
    config: dict                        # overrides of COMMON (model, train)
    rounds: int = 40
    frozen: bool = True                 # share with lr 0 (a fixed stream), or keep learning


@dataclass
class Batch:
    name: str
    about: str
    peer: dict
    receivers: dict[str, dict]          # receiver name -> overrides of RECEIVER
    collaboration: str = "vertical"
    expert: Expert | None = None        # the peer is this expert (peer = its config then)
    settings: dict = field(default_factory=dict)   # overrides of COMMON for every node of the batch
    eval_limit: int | dict[str, int] | None = None   # prompts per eval set, or per set {"id": .., "ood": ..}
    rounds: int | None = None           # receivers' rounds (None: the runner's --rounds)


@dataclass
class SwarmBatch:
    """K fresh nodes that all share and learn from each other, against the same K nodes alone
    (`alone-i`: same node id and seed, so the same prompts and sampling seeds).

    ``arms`` (issue 28): several swarms of the same K nodes, each arm its own swarm (topic),
    differing only in the arm's overrides (`ARM-i`); without arms, one swarm (`swarm-i`).
    ``per_node``: overrides for node i (a heterogeneous swarm), applied to its alone twin too."""
    name: str
    about: str
    k: int
    node: dict                          # overrides of RECEIVER for every node (method, ...)
    collaboration: str = "vertical"
    settings: dict = field(default_factory=dict)
    eval_limit: int | dict[str, int] | None = None
    rounds: int | None = None
    arms: dict[str, dict] = field(default_factory=lambda: {"swarm": {}})
    per_node: list[dict] = field(default_factory=list)
    extras: dict[str, tuple[int, dict]] = field(default_factory=dict)   # name -> (node i, overrides of its twin alone)
    # H7: in every arm, the nodes other than this one run on past R (checkpointing every round)
    # until this node's stop record, and are scored on their round-R checkpoint (runon.py);
    # "slowest": every node of an arm runs on until all of them have reached R (issue 65.5)
    run_on_until: int | str | None = None
    # model files some nodes start from (repository-relative path -> the record naming its sha256):
    # the runner refuses to train on any other bytes (run.check_weights)
    weights: dict[str, str] = field(default_factory=dict)
    # arms trained on some seeds only (H9: the control arm `any` on seeds 0-2): arm -> its seeds;
    # an arm not named here runs on every seed, the twins alone always
    arm_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.arm_seeds) - set(self.arms)
        if unknown:
            raise ValueError(f"batch {self.name}: arm_seeds names {', '.join(sorted(unknown))}, not an arm "
                             f"({', '.join(self.arms)})")

    def on_seed(self, name: str, seed: int) -> bool:
        """Whether receiver NAME trains on SEED (an arm of ``arm_seeds`` only on its seeds)."""
        arm = name.rsplit("-", 1)[0]
        return arm not in self.arm_seeds or seed in self.arm_seeds[arm]

    def node_config(self, i: int) -> dict:
        return merge(self.node, self.per_node[i] if self.per_node else {})

    def runs_on(self, name: str) -> bool:
        """Whether receiver NAME runs on past R (a swarm arm's node other than ``run_on_until``;
        never a node alone, whose rounds are the twin's R)."""
        if self.run_on_until is None or name not in self.receivers:
            return False
        arm, i = name.rsplit("-", 1)
        return arm in self.arms and (self.run_on_until == "slowest" or int(i) != self.run_on_until)

    @property
    def receivers(self) -> dict[str, dict]:
        """Every node the batch trains and evaluates, by run-directory name."""
        alone = {"swarm": {"collaboration": "alone", "share": False}}
        return {**{f"{arm}-{i}": merge(self.node_config(i), over) for arm, over in self.arms.items()
                   for i in range(self.k)},
                **{f"alone-{i}": merge(self.node_config(i), alone) for i in range(self.k)},
                **{name: merge(self.node_config(i), alone, over) for name, (i, over) in self.extras.items()}}


def _method(m: str, **train) -> dict:
    return {"train": {"method": m, **train}}


BATCHES = {
    "methods": Batch(
        "methods",
        "isolated vs learning from a SmolLM2 peer that fully fine-tunes, generates with HF at T = 0.7, "
        "under each objective",
        peer=SMOL_FULL_HF_T07,
        receivers={"alone": {"swarm": {"collaboration": "alone"}},
                   "nois": _method("nois"), "tis": _method("tis"),
                   "f-tis": _method("f-tis", kl_threshold=5.0), "f-vis": _method("f-vis", kl_threshold=5.0)},
    ),
    # The same peer again (it learns from nobody and is seeded, so its stream repeats; one thread
    # each makes the CPU arithmetic repeat too); g = 5 is the `methods` batch's f-tis.
    "sweep": Batch(
        "sweep",
        "the `methods` peer; f-tis with the KL threshold g = 1 (g = 5 is in `methods`; a threshold above "
        "every sample's KL drops nothing, so 50 and 200 equal 5 here) and g = 0.05, below the paper's range",
        peer=SMOL_FULL_HF_T07,
        receivers={f"f-tis-g{g}": _method("f-tis", kl_threshold=float(g)) for g in (0.05, 1)},
    ),
    "horizontal": Batch(
        "horizontal",
        "the `methods` peer, but each node samples half of every group and the advantage is over the union",
        peer=SMOL_FULL_HF_T07, collaboration="horizontal",
        receivers={"nois": _method("nois"), "f-tis": _method("f-tis", kl_threshold=5.0)},
    ),
    "full-peer": Batch(
        "full-peer",
        "LoRA vs full fine-tuning, nothing else different: the peer fully fine-tunes SmolLM2 and generates "
        "with llama.cpp (merged F32 export every round), T = 1",
        peer=SMOL_FULL,
        receivers={"f-tis": _method("f-tis", kl_threshold=5.0)},
    ),
    "quant-vs-hf": Batch(
        "quant-vs-hf",
        "llama.cpp-quantised vs HF generator: receivers sample from the shipped Q4_1 GGUF (+ adapter), "
        "the peer (LoRA) samples with HF transformers from its live weights, T = 1",
        peer=SMOL_LORA_HF,
        receivers={"f-tis": merge(_method("f-tis", kl_threshold=5.0), {"model": {"precision": "quantized"}})},
    ),
    "gemma-peer": Batch(
        "gemma-peer",
        "SmolLM2 vs Gemma 3 270M (other tokenizer: peer text re-tokenized, sequence-level weights), "
        "the peer LoRA on llama.cpp, T = 1",
        peer=GEMMA_LORA,
        receivers={"f-tis": _method("f-tis", kl_threshold=5.0)},
    ),
}


# ---------------------------------------------------------------- issue 18: does joining help?
# Plan and power estimate: docs/results.md, "Does joining the swarm help? (plan)". Every node of
# these batches checkpoints every round, so a stopped batch resumes losing at most one round.
VALUE = {
    "node": {"checkpoint_every": 1},
    "task": {"prompts_per_round": 4, "num_generations": 8, "max_completion_length": 64},
    "train": {"kl_threshold": 5.0},
}
VALUE_EVAL = 200                        # held-out greedy prompts per eval set (ID and OOD)
VALUE_ROUNDS = 16                       # receivers' rounds: the pre-registered rule (largest R <= 16 that fits ~4 h; pilot: docs/results.md)
SMOL_EXPERT = Expert("smol-lora-40", {"model": {"spec": "smollm2-135m", "backend": "llamacpp", "precision": "f16"},
                                      "train": {"trainable": "lora", "learning_rate": 2e-4}}, rounds=40)
GEMMA_EXPERT = Expert("gemma-lora-40", GEMMA_LORA, rounds=40)
# The expert shares as much per round as a receiver generates: its 4 groups.
EXPERT_RECEIVER = {"swarm": {"max_peer_groups": 4, "max_groups_per_peer": 4}}   # all 4 of the one peer

BATCHES.update({
    "expert-smol": Batch(
        "expert-smol",
        "expertise: a SmolLM2 node trained alone for 40 rounds first, then frozen and sharing; fresh "
        "receivers learn alone / nois / f-tis from it",
        peer=SMOL_EXPERT.config, expert=SMOL_EXPERT, settings=VALUE, eval_limit=VALUE_EVAL, rounds=VALUE_ROUNDS,
        receivers={"alone": {"swarm": {"collaboration": "alone"}},
                   "nois": merge(EXPERT_RECEIVER, _method("nois")),
                   "f-tis": merge(EXPERT_RECEIVER, _method("f-tis"))},
    ),
    "expert-gemma": Batch(
        "expert-gemma",
        "the same with a Gemma 3 270M expert (other tokenizer): f-tis with span-aligned weights vs "
        "sequence-level weights vs nois vs alone",
        peer=GEMMA_EXPERT.config, expert=GEMMA_EXPERT, settings=VALUE, eval_limit=VALUE_EVAL, rounds=VALUE_ROUNDS,
        receivers={"alone": {"swarm": {"collaboration": "alone"}},
                   "nois": merge(EXPERT_RECEIVER, _method("nois")),
                   "f-tis-span": merge(EXPERT_RECEIVER, _method("f-tis", cross_tokenizer_level="span")),
                   "f-tis-seq": merge(EXPERT_RECEIVER, _method("f-tis", cross_tokenizer_level="sequence"))},
    ),
    "swarm4": SwarmBatch(
        "swarm4",
        "symmetric swarm: 4 fresh SmolLM2 nodes (different seeds) that all share and learn from each other "
        "with f-tis, against the same 4 nodes alone; equal own compute per node",
        k=4, node=merge(_method("f-tis"), {"swarm": {"share": True, "max_peer_groups": 12, "max_groups_per_peer": 4,
                                                     "max_wait_s": 120.0}}),
        settings=VALUE, eval_limit=VALUE_EVAL, rounds=VALUE_ROUNDS,
    ),
})


# ---------------------------------------------------------------- issue 28: batch fill (H4, H5)
# Plan, hypotheses and decision rules: docs/results.md, "Joining a swarm saves your compute
# (plan, issue 28)". B = 4 groups a round as before; a swarm node generates `own_groups` of
# them and fills the rest with peers' groups (informative first, at most 2 of one peer),
# generating what the swarm does not supply within max_wait_s itself.
FILL_ROUNDS = 32                        # R by the pilot's rule (docs/results.md): the largest R <= 32 that fits 5 h
FILL_WAIT_S = 60.0                      # a node waits at most this long a round for peers' groups


def _fill(own: int) -> dict:
    """A batch-fill swarm node (swarm keys here, not in settings: RECEIVER's would win over those)."""
    return {"swarm": {"share": True, "own_groups": own, "max_peer_groups": 4 - own, "max_groups_per_peer": 2,
                      "max_wait_s": FILL_WAIT_S, "max_staleness": 2}}


# The heterogeneous four of the paper: two SmolLM2 LoRA on llama.cpp (node seeds differ), SmolLM2
# full fine-tuning on HF at T = 0.7, Gemma 3 270M LoRA (other tokenizer: span-level weights).
HETERO_NODES = [
    {},
    {},
    {"model": {"spec": "smollm2-135m", "backend": "hf"}, "train": {"trainable": "full", "learning_rate": 1e-5},
     "task": {"temperature": 0.7}},
    merge(GEMMA_LORA, {"train": {"cross_tokenizer_level": "span"}}),
]

BATCHES.update({
    "fill4": SwarmBatch(
        "fill4",
        "H4, batch fill in a homogeneous swarm: 4 fresh SmolLM2 LoRA nodes generating 1 (arm own1) or 2 "
        "(arm own2) of their 4 groups a round, the rest from peers, against the same 4 nodes alone",
        k=4, node=_method("f-tis"), settings=VALUE, eval_limit=VALUE_EVAL, rounds=FILL_ROUNDS,
        arms={"own1": _fill(1), "own2": _fill(2)},
    ),
    "fill-hetero": SwarmBatch(
        "fill-hetero",
        "H5, batch fill in a heterogeneous swarm (SmolLM2 LoRA x2, SmolLM2 full FT on HF at T = 0.7, "
        "Gemma 3 LoRA), each generating 1 of 4 groups: f-tis on every node vs nois on every node vs alone",
        k=4, node=_method("f-tis"), settings=VALUE, eval_limit=VALUE_EVAL, rounds=FILL_ROUNDS, per_node=HETERO_NODES,
        arms={"ftis": merge(_fill(1), _method("f-tis")), "nois": merge(_fill(1), _method("nois"))},
    ),
})

# H6 (docs/results.md, "H6, pre-registered"): the heterogeneous swarm of H5 on the final code, the
# held-out eval and its guard on for every node (the twins' guard is inert: a node alone is never
# touched), arm `protect` with the protections for another model's samples on (IS cap 1, length rule,
# success weights: the defaults when H6 was registered and run; off by default since H6 decided),
# arm `ftis` with them off (today's F-TIS, as H5's arm `ftis`), each against the same four nodes
# alone. R and the in-run eval as registered there.
H6_EVAL = {"eval": {"every": 8, "prompts": 32, "guard": True}}
PROTECTIONS_ON = {"train": {"foreign_is_cap": 1.0, "foreign_length_rule": "refuse",
                            "foreign_success_floor": 0.5, "mask_truncated_completions": False}}
PROTECTIONS_OFF = {"train": {"foreign_is_cap": 0.0, "foreign_length_rule": "truncate",
                             "foreign_success_floor": 1.0, "mask_truncated_completions": False}}
H6_ROUNDS = 32

BATCHES["h6"] = SwarmBatch(
    "h6",
    "H6, the node that differs: H5's heterogeneous swarm (SmolLM2 LoRA x2, SmolLM2 full FT on HF at "
    "T = 0.7, Gemma 3 LoRA) with the held-out guard, f-tis with the protections for another model's "
    "samples (arm protect) vs without (arm ftis) vs alone; decided per kind of node on held-out accuracy",
    k=4, node=_method("f-tis"), settings=merge(VALUE, H6_EVAL), eval_limit=VALUE_EVAL, rounds=H6_ROUNDS,
    per_node=HETERO_NODES,
    arms={"protect": merge(_fill(1), _method("f-tis"), PROTECTIONS_ON), "ftis": merge(_fill(1), _method("f-tis"), PROTECTIONS_OFF)},
)

# The swarm guard (docs/node.md, "The swarm guard"), shown where the swarm harms a node and where it
# does not: H5's heterogeneous swarm with nois on every node (its Gemma node fell from 72.5 % alone to
# 0 % held-out) and H4's homogeneous swarm (held-out ID −0.010 ± 0.003), both with the in-run eval
# every 4 rounds on 32 prompts and the guard on. Only the swarm arms tell anything here (a node alone
# is never guarded): run them with --receivers (docs/runs/guard/README.md has the commands).
GUARD_EVAL = {"eval": {"every": 4, "prompts": 32, "guard": True}}

BATCHES.update({
    "guard-hetero": SwarmBatch(
        "guard-hetero",
        "the swarm guard where the swarm harms: H5's heterogeneous swarm with nois on every node, in-run "
        "eval every 4 rounds with the guard on",
        k=4, node=_method("nois"), settings=merge(VALUE, GUARD_EVAL), eval_limit=VALUE_EVAL, rounds=FILL_ROUNDS,
        per_node=HETERO_NODES, arms={"nois": merge(_fill(1), _method("nois"))},
    ),
    "guard-homo": SwarmBatch(
        "guard-homo",
        "the swarm guard where the swarm does not harm: H4's homogeneous swarm (4 SmolLM2 LoRA, own1), "
        "in-run eval every 4 rounds with the guard on",
        k=4, node=_method("f-tis"), settings=merge(VALUE, GUARD_EVAL), eval_limit=VALUE_EVAL, rounds=FILL_ROUNDS,
        arms={"own1": _fill(1)},
    ),
})


# H7 (docs/results.md, "H7, pre-registered"): H6's heterogeneous swarm (own_groups = 1, R = 32) with
# today's plain F-TIS (arm `ftis`, the control) against the worth-aware exchange (arm `worth`: fill by
# worth and outcome-based prompt choice), each node against its twin alone, plus the Gemma node alone
# generating one group a round (`alone1-3`: equal own tokens, separating "peers are worth little" from
# "less own work"). Registered before any run; run on the code after Speed III (issue 52).
WORTH_ON = {"swarm": {"fill_by_worth": True, "worth_threshold": 0.5, "worth_window": 8, "prompt_choice": "outcomes"}}
BATCHES["h7"] = SwarmBatch(
    "h7",
    "H7, worth not tokens: H6's heterogeneous swarm, plain F-TIS (arm ftis) vs the worth-aware exchange "
    "(arm worth: fill by worth + prompts from outcomes) vs alone, plus the Gemma node alone at one group a round",
    k=4, node=_method("f-tis"), settings=merge(VALUE, H6_EVAL), eval_limit=VALUE_EVAL, rounds=H6_ROUNDS,
    per_node=HETERO_NODES,
    arms={"ftis": merge(_fill(1), _method("f-tis"), PROTECTIONS_OFF),
          "worth": merge(_fill(1), _method("f-tis"), PROTECTIONS_OFF, WORTH_ON)},
    extras={"alone1-3": (3, {"task": {"prompts_per_round": 1}})},
    run_on_until=3,     # the SmolLM2 peers keep sending until the Gemma node stops (registered)
)


# H8 (docs/results.md, "H8, as registered"): the paper's own heterogeneity, expertise within one
# tokenizer. Nodes 0 and 1 start from base SmolLM2-135M, nodes 2 and 3 from the arith-level-6 expert
# (docs/results.md, "The expert for H8"): same tokenizer, another base model. Every node is a LoRA
# node on llama.cpp generating 1 of 4 groups; arm `ftis` (the code's defaults, as H7 left them) vs
# arm `nois` (peers' text treated as one's own: the paper's failure mode) vs each node alone. Arms
# `g0.05` and `g0.5` are F-TIS with a smaller KL threshold (arm ftis has the default g = 5): the
# sweep, run on seed 0 only.
EXPERT_RECORD = "docs/runs/expert/record.json"               # the expert's recipe, evals and sha256
EXPERT_GGUF = "runs/expert-arith-l6/export/model-f16.gguf"   # what `python -m experiments.expert` exports
H8_G = (0.05, 0.5)


def expert_spec() -> str:
    """The expert's GGUF as an absolute path: nodes and evals start with cwd = the repository root,
    but a node file resolves a relative path against its own folder."""
    from pathlib import Path
    return str(Path(__file__).resolve().parents[2] / EXPERT_GGUF)


H8_NODES = [{}, {}, {"model": {"spec": expert_spec()}}, {"model": {"spec": expert_spec()}}]
BATCHES["h8"] = SwarmBatch(
    "h8",
    "H8, experts of one family: 2 base SmolLM2 LoRA nodes + 2 started from the arith-level-6 expert, "
    "F-TIS (arm ftis) vs NoIS (arm nois) vs alone; arms g0.05 / g0.5 sweep the KL threshold (seed 0)",
    k=4, node=_method("f-tis"), settings=merge(VALUE, H6_EVAL), eval_limit=VALUE_EVAL, rounds=H6_ROUNDS,
    per_node=H8_NODES,
    arms={"ftis": merge(_fill(1), _method("f-tis")), "nois": merge(_fill(1), _method("nois")),
          **{f"g{g:g}": merge(_fill(1), _method("f-tis", kl_threshold=g)) for g in H8_G}},
    weights={EXPERT_GGUF: EXPERT_RECORD},
)


# H9 (docs/results.md, "H9, as registered"; issue 65 item 6): kin, not crowds. Five nodes: H6/H7's
# SmolLM2 LoRA x2 on llama.cpp (nodes 0, 1) and SmolLM2 full fine-tuning on HF (node 2), and two
# Gemma 3 270M LoRA nodes (3, 4: each Gemma node has kin), each generating 1 of 4 groups. Arm `kin`
# fills own slots only from kin (swarm.fill = "kin"); arm `any` is today's default fill, the
# within-seed control, on seeds 0-2 only; each node's twin alone. Otherwise the code's defaults:
# another tokenizer's text is not trained (COMMON turns it on, as H6-H8 ran, so H9 turns it back)
# and the protections for another model's samples are today's defaults (equal to PROTECTIONS_OFF,
# so H9 names neither). Every node of an arm serves until the slowest has reached R (issue 65.5).
H9_NODES = [*HETERO_NODES[:3], HETERO_NODES[3], HETERO_NODES[3]]
H9_GEMMA = (3, 4)
# Held-out: the first 400 of arith's unseen-by-text level 1-2 eval split (all 49 level-1 questions
# there are, then 351 of level 2; its first 200 are H7's and H8's) and 200 of level 3
H9_EVAL = {"id": 400, "ood": 200}
TODAYS_FOREIGN = {"train": {"other_tokenizer": False, "foreign_budget": True}}
H9_CONTROL_SEEDS = (0, 1, 2)
H9_SEEDS = 6
BATCHES["h9"] = SwarmBatch(
    "h9",
    "H9, kin not crowds: SmolLM2 LoRA x2, SmolLM2 full FT on HF, Gemma 3 LoRA x2, filling own slots only "
    "from kin (arm kin) vs today's default fill (arm any, seeds 0-2) vs alone; decided per kind",
    k=5, node=_method("f-tis"), settings=merge(VALUE, H6_EVAL, TODAYS_FOREIGN), eval_limit=H9_EVAL,
    rounds=H6_ROUNDS, per_node=H9_NODES,
    # `any` named, not left to the default: the control stays today's fill if H9 moves the default
    arms={"kin": merge(_fill(1), {"swarm": {"fill": "kin"}}), "any": merge(_fill(1), {"swarm": {"fill": "any"}})},
    arm_seeds={"any": H9_CONTROL_SEEDS},
    run_on_until="slowest",
)
