"""The node file: schema, defaults, validation, and the commented ``node.toml`` template.

One node = one process = one config file. Every setting has a default, so an empty file (or
no file) is the offline default node. The schema below is the single source of truth: the
validator, ``ftis-edge init`` (the commented template) and the README's reference table are
all generated from it.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import socket
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .common.task_names import name_problem
from .errors import FtisError
from .generate.registry import BACKENDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(FtisError, ValueError):
    """A config problem, with the offending key in the message."""


def _opt(default, doc, *, choices=None, lo=None, hi=None, kind=None, trl=""):
    """A setting: default value, one-line doc, its constraints, and the TRL ``GRPOConfig`` field
    it corresponds to (``trl``; docs/trl.md says how closely)."""
    return field(default=default, metadata={"doc": doc, "choices": choices, "lo": lo, "hi": hi,
                                            "kind": kind, "trl": trl})


def _list_opt(default, doc):
    return field(default_factory=lambda: list(default), metadata={"doc": doc, "kind": "list[str]"})


def _table_opt(doc):
    return field(default_factory=dict, metadata={"doc": doc, "kind": "table"})


# train.learning_rate = "auto": LoRA moves few weights and needs a large step; full fine-tuning
# at a LoRA rate collapses the model within a round (format 21% -> 0%, KL in the thousands).
AUTO_LEARNING_RATE = {"lora": 1e-4, "full": 5e-6}
# `ftis-edge export` names its merged models generically (export.py): model-f16.gguf, model-q8_0.gguf ...
EXPORTED_STEMS = ("model-f16", "model-q8_0", "model-q4_k_m")


@dataclass
class NodeSection:
    id: str = _opt("", "node name shown to peers (default: <hostname>-<config file name>, e.g. pc-alice for "
                       "alice.toml; <hostname>-<model> without a file)")
    run_dir: str = _opt("runs/{id}", "where metrics, checkpoints and adapters go ({id} = node id; a relative path "
                       "is relative to the node file's folder)")
    seed: int = _opt(0, "seed for prompts, sampling and training", lo=0, trl="seed")
    rounds: int = _opt(30, "training rounds (one optimiser step each)", lo=1, trl="max_steps")
    checkpoint_every: int = _opt(5, "write a checkpoint every N rounds (and at the end)", lo=1)


@dataclass
class ModelSection:
    spec: str = _opt("smollm2-135m", "model: alias (smollm2-135m, gemma3-270m), .gguf path, HF dir or HF hub id")
    backend: str = _opt("auto", "generator engine (auto = llamacpp, or hf when the learner has a GPU that "
                        "this llama.cpp build cannot use)", choices=("auto", *BACKENDS))
    precision: str = _opt("f16", "llama.cpp weights: f16 re-export (matches the learner) or the quantized GGUF as shipped",
                          choices=("f16", "quantized"))
    threads: int = _opt(0, "CPU threads for generation and training (0 = all cores)", lo=0)
    device: str = _opt("auto", "learner device: auto (CUDA, else Apple MPS, else CPU), cpu, cuda, mps",
                       choices=("auto", "cpu", "cuda", "mps"))


@dataclass
class TrainSection:
    trainable: str = _opt("lora", "what is trained", choices=("lora", "full"))
    lora_r: int = _opt(8, "LoRA rank", lo=1, hi=1024)
    lora_alpha: float = _opt(16.0, "LoRA alpha (scale = alpha / r)", lo=0.0)
    lora_dropout: float = _opt(0.0, "LoRA dropout", lo=0.0, hi=0.9)
    lora_targets: list = _list_opt(["q_proj", "k_proj", "v_proj", "o_proj"], "modules that get a LoRA adapter")
    learning_rate: float | str = _opt("auto", "Adam learning rate; \"auto\" follows train.trainable: 1e-4 for "
                                      "lora, 5e-6 for full (a LoRA rate wrecks a fully trained model in one step)",
                                      lo=0.0, hi=1.0, kind="number_or_auto", trl="learning_rate")
    max_grad_norm: float = _opt(1.0, "gradient-norm clip (0 = off)", lo=0.0, trl="max_grad_norm")
    micro_batch: int = _opt(8, "samples per forward/backward (halved automatically on out-of-memory)", lo=1)
    precision: str = _opt("auto", "the learner's arithmetic: auto = bf16 autocast on CUDA, fp32 on a CPU; bf16 "
                          "on a CPU pays only with avx512_bf16 / AMX (there 0.75x the step's CPU seconds, "
                          "log-probs ~0.015 nats a token off fp32; docs/benchmarks.md)",
                          choices=("auto", "fp32", "bf16"), trl="bf16")
    method: str = _opt("f-tis", "objective", choices=("nois", "vis", "tis", "f-tis", "f-vis"))
    C: float = _opt(2.0, "truncation cap of the importance weight", lo=1.0, trl="vllm_importance_sampling_cap")
    epsilon: float = _opt(0.2, "PPO clip range (vis, f-vis, tis inner clip)", lo=0.0, hi=1.0, trl="epsilon")
    kl_threshold: float = _opt(5.0, "F- filter: drop a sample when advantage <= 0 and KL > this", lo=0.0)
    advantage_scale: str = _opt("std", "advantage normalisation (none = Dr. GRPO)", choices=("std", "none"),
                                trl="scale_rewards")
    normalize: str = _opt("all", "divide the loss by all samples or by the kept ones (authors' code)",
                          choices=("all", "kept"))
    cross_tokenizer_level: str = _opt("span", "IS weights for peers with another tokenizer: per span between "
                                      "shared byte boundaries, or one per sequence", choices=("span", "sequence"))
    peer_plausibility: bool = _opt(True, "do not train on same-tokenizer peer samples whose text the learner "
                                   "finds far less likely than its own completions, and train another tokenizer's "
                                   "samples at a bounded weight (poisoning defence; plausibility.py)")
    # The three protections below are off by default: over H6's three seeds (docs/results.md) they did
    # not help the node they were built for (Gemma among SmolLM2 peers: -2.3 ± 0.4 ID points against
    # plain F-TIS) and moved the other nodes by 1-2 points either way. They stay as switches.
    foreign_is_cap: float = _opt(0.0, "upper cap on the IS weight of samples from another model (another tokenizer, "
                                 "or ours with other base weights: the rollout's fingerprints differ from ours) "
                                 "instead of C: at 1 a peer text the learner has come to like is never "
                                 "up-weighted (0 = off: C; off by default, H6)", lo=0.0)
    foreign_length_rule: str = _opt("truncate", "samples from another model longer than task.max_completion_length "
                                    "in our tokens, or cut by their generator: refused whole, or truncated to "
                                    "our budget (the default, H6)", choices=("refuse", "truncate"))
    foreign_success_floor: float = _opt(1.0, "weight samples from another model by their peer's success rate this "
                                        "round relative to ours, min(1, rate_peer / rate_own), never below this "
                                        "floor (rates: mean reward clipped to [0, 1], one success and one "
                                        "failure added; 1 = off, the default, H6)", lo=0.0, hi=1.0)
    other_tokenizer: bool = _opt(False, "train on text from peers with another tokenizer (re-tokenized, at the bound "
                                 "of peer_plausibility). Off by default: in H6 (3 seeds) a Gemma node among SmolLM2 "
                                 "peers learned like its twin alone at equal own tokens, and in H7 (5 seeds) it ended "
                                 "-18.0 +- 4.2 ID points below its twin on F-TIS, its held-out accuracy following its "
                                 "own tokens only (docs/results.md); no judge checks such text, so off also closes "
                                 "that poisoning route. Off, such groups are still graded, counted (worth, outcomes), "
                                 "relayed and reported (peers/skipped_other_tokenizer); they fill no slot")
    foreign_budget: bool = _opt(True, "with other_tokenizer on: bound what that text moves, not only what it weighs: "
                                "all of it at most 1/8 of a step's |advantage| x weight, none in a step without "
                                "other signal, at most 1/2 of one step's per peer and 1 step's per kind over 20 "
                                "steps (ftis_edge/learn/foreign_budget.py), its IS weight capped at 1 (no judge "
                                "checks it; issue 62 item 2), and how far it moves the weights in any one direction: "
                                "the decayed sum of a peer's gradient at most 0.5 of the own gradient's norm, of all "
                                "such peers' 0.5 per peer told apart by key, at most 1.0 "
                                "(ftis_edge/learn/foreign_direction.py). Over 60 steps a payload from one peer still "
                                "ends +0.6-0.9 nats above a run without it, from two keyed peers +1.1-1.3 "
                                "(docs/relay.md): turn other_tokenizer on only among peers you trust, name them in "
                                "other_tokenizer_peers, on a relay with keys")
    other_tokenizer_peers: list = _list_opt([], "with other_tokenizer on: train another tokenizer's text only from "
                                            "these node ids (a friend's Gemma node; empty = from any peer). Ids "
                                            "are free, so the direction bound counts as distinct only peers named "
                                            "here on a relay with CURVE keys (where an id is bound to its key): "
                                            "each adds one peer's budget to the kind's, up to 1.0; with no names, "
                                            "or on an open relay (ids are claims: docs/relay.md, Identity), every "
                                            "sender of such text shares one peer's budget. Others' such text is "
                                            "skipped as with other_tokenizer off")
    mask_truncated_completions: bool = _opt(False, "completions cut at the length limit (own and peers') count "
                                            "in their group's advantages but are not trained on",
                                            trl="mask_truncated_completions")

    @property
    def bounds_other_tokenizer(self) -> bool:
        """Another tokenizer's text trains under the budget and the direction bound (foreign_budget.py,
        foreign_direction.py), its IS weight capped at 1."""
        return self.other_tokenizer and self.foreign_budget

    @property
    def lr(self) -> float:
        """The learning rate in force: ``learning_rate``, or for "auto" the one that suits ``trainable``."""
        return AUTO_LEARNING_RATE[self.trainable] if self.learning_rate == "auto" else float(self.learning_rate)


@dataclass
class TaskSection:
    name: str = _opt("arith", "task: arith, gsm8k, math500, reasoning_gym, jsonl, or your class "
                     "module:Class / an entry point (docs/tasks.md)")
    path: str = _opt("", "dataset jsonl (gsm8k/math500: default the data folder of ./install.sh --data; jsonl: your file; "
                    "relative to the node file's folder)")
    datasets: dict = _table_opt("reasoning_gym: dataset -> { weight, level (0 = easiest), size, eval_size, "
                                "dataset settings }, e.g. { chain_sum = {}, basic_arithmetic = { weight = 2 } }")
    eval_path: str = _opt("", "jsonl: held-out eval file (empty = hold out eval_fraction of path)")
    eval_fraction: float = _opt(0.1, "jsonl: share of path's lines held out for eval when there is no eval_path",
                                lo=0.0, hi=0.99)
    question_field: str = _opt("question", "jsonl: the question's field name")
    answer_field: str = _opt("answer", "jsonl: the answer's field name")
    grade: str = _opt("math", "jsonl: math (math-verify equivalence), exact (same text) or regex "
                      "(the answer field is a pattern)", choices=("math", "exact", "regex"))
    ignore_case: bool = _opt(False, "jsonl exact/regex: compare case-insensitively")
    options: dict = _table_opt("your task class's own options (passed as keyword arguments)")
    level: list = field(default_factory=list, metadata={
        "doc": "arith difficulty levels to mix (empty = the task's default)", "kind": "list[int]"})
    reward: str = _opt("binary", "binary (1 = correct + format) or shaped (format credit)",
                       choices=("binary", "shaped"))
    prompts_per_round: int = _opt(4, "groups this node trains on each round (B); it generates all of them "
                                  "unless swarm.own_groups turns batch fill on", lo=1, hi=1024)
    num_generations: int = _opt(8, "completions per prompt (G)", lo=2, hi=256, trl="num_generations")
    max_completion_length: int = _opt(128, "completion length cap (tokens)", lo=1, hi=32768,
                                      trl="max_completion_length")
    temperature: float = _opt(1.0, "sampling temperature (the behaviour log-probs honour it)", lo=0.01, hi=2.0,
                              trl="temperature")
    top_k: int = _opt(0, "top-k truncation (0 = off)", lo=0, trl="top_k")
    top_p: float = _opt(1.0, "top-p truncation (1 = off)", lo=0.01, hi=1.0, trl="top_p")
    reward_timeout_s: float = _opt(0.5, "time budget to grade one completion", lo=0.01, hi=60.0)
    few_shot: int = _opt(2, "worked examples in the prompt (small models need them to use the tags)", lo=0, hi=2)
    require_think: bool = _opt(False, "reward only completions that also reason inside <think>...</think>")


@dataclass
class SwarmSection:
    collaboration: str = _opt("vertical", "vertical (whole groups), horizontal (split groups), alone",
                              choices=("vertical", "horizontal", "alone"))
    relay: str = _opt("", "relay address, e.g. tcp://relay.example.org:5555 (empty = alone)")
    name: str = _opt("ftis", "swarm (topic) to join")
    client_keys: str = _opt("", "directory with this node's CURVE certificate (from ftis-relay keygen)")
    server_key: str = _opt("", "the relay's public certificate file (enables CURVE)")
    max_staleness: int = _opt(2, "ignore peer rollouts more than this many rounds old", lo=0)
    max_wait_s: float = _opt(2.0, "wait at most this long for peers each round", lo=0.0, hi=3600.0)
    max_peer_groups: int = _opt(8, "use at most this many peer groups per round (0 = learn from none)", lo=0)
    max_groups_per_peer: int = _opt(2, "use at most this many groups of one peer per round (vertical: no single "
                                    "peer fills the batch)", lo=1)
    own_groups: int = _opt(1, "batch fill (vertical): generate at least this many of the round's "
                           "task.prompts_per_round groups, fill the rest with fresh peer groups and generate what "
                           "the swarm does not supply within max_wait_s (0 = off: generate all, peers' groups come "
                           "on top). Default 1: H4 in docs/results.md (5.5x fewer own tokens, 1.9x fewer "
                           "CPU-seconds, no loss of reward)", lo=0, hi=1024)
    fill_by_worth: bool = _opt(False, "take each kind of peer (same model, same tokenizer, other tokenizer) only while "
                               "its groups are worth an own group: its success against yours x what its trained "
                               "samples count (ftis_edge/peers/worth.py); a kind not worth it leaves its slots to your own "
                               "generation and is not trained on. Off by default: in H7 (5 seeds, with prompt_choice "
                               "= \"outcomes\"; docs/results.md) it lifted a Gemma node among SmolLM2 peers by "
                               "+0.10 +- 0.06 ID over plain F-TIS (under the registered 2 SE), but that node still ended "
                               "0.08 below its twin alone with only 1.26x fewer own tokens, and same-model LoRA nodes "
                               "saved under 3x in 2 pairs of 10")
    fill: str = _opt("any", "batch fill: which peers' groups may take own slots. any: every peer's (with "
                     "fill_by_worth: per kind of peer); kin: only peers whose samples weigh near-full in your step "
                     "(kin_share) and who succeed at least kin_capability as often as you, and at most B*k/(k+1) "
                     "of the task.prompts_per_round groups for k such peers (one: half; three: three quarters); "
                     "without kin a node generates its whole batch (ftis_edge/peers/kin.py). \"any\" stays the "
                     "default until H9 (docs/results.md) decides: kin is the candidate default",
                     choices=("any", "kin"))
    kin_share: float = _opt(0.9, "fill = \"kin\": what a peer's samples must weigh in your step against yours "
                            "(truncated IS weight capped at 1 x the learner's bounds, averaged over worth_window rounds)",
                            lo=0.0, hi=1.0)
    kin_capability: float = _opt(0.9, "fill = \"kin\": a peer's success rate over yours (Laplace-smoothed, over "
                                 "worth_window rounds) must reach this, less one standard error of the difference "
                                 "(chance alone does not shut a twin out); below it the gate closes", lo=0.0, hi=1.0)
    worth_threshold: float = _opt(0.5, "fill_by_worth: the worth a kind of peer needs to fill a slot (an own group = 1)",
                                  lo=0.0, hi=1.0)
    worth_window: int = _opt(8, "fill_by_worth and fill = \"kin\": rounds of evidence kept per kind of peer "
                             "(per peer)", lo=1, hi=1000)
    prompt_choice: str = _opt("stream", "own prompts: stream (the task's, a pure function of seed and round) or "
                              "outcomes (prefer prompts peers of any model answered where your group is likelier "
                              "to carry signal, ftis_edge/peers/outcomes.py; vertical swarms; H7 tested it only together with "
                              "fill_by_worth, and neither became the default)", choices=("stream", "outcomes"))
    hints: bool = _opt(False, "a pilot (issue 66): on a prompt where none of your own answers was right and a "
                       "peer's answer on it was graded right here, generate a second group with the first half "
                       "of that answer's reasoning opening your turn (the answer cut out; ftis_edge/peers/hints.py) "
                       "and train on it instead if it carries signal: your own tokens and log-probs, in the "
                       "hinted context; evals never see a hint. Works across tokenizers (it is text). Needs "
                       "prompts your peers also answer: with prompt_choice = \"stream\" nodes rarely share one. "
                       "Off until a pilot shows a lift (docs/results.md)")
    delivery_budget: int = _opt(0, "peer groups the relay sends this node per 10 s (0 = max_peer_groups, -1 = all)", lo=-1)
    share: bool = _opt(True, "publish own rollouts to the swarm (false = learn from peers, share nothing)")
    rescore_budget_s: float = _opt(5.0, "total time to re-grade one round's peer completions", lo=0.1)
    quarantine_after: int = _opt(5, "quarantine a peer once this many of its last quarantine_window rollouts were refused", lo=1)
    quarantine_window: int = _opt(20, "how many of a peer's latest rollouts the quarantine rule looks at", lo=1)
    quarantine_rate: float = _opt(0.5, "quarantine only when the refused ones are also at least this fraction of that window",
                                  lo=0.01, hi=1.0)


@dataclass
class EvalSection:
    every: int = _opt(10, "held-out eval every N rounds, plus round 0 (the base model) and the last round "
                      "(0 = off); greedy, on the generator already loaded (ftis_edge/run/heldout.py)", lo=0,
                      trl="eval_steps")
    prompts: int = _opt(32, "held-out prompts per eval: the first N of the task's eval split, the same ones "
                        "every time (compared prompt by prompt)", lo=1, hi=10000)
    guard: bool = _opt(True, "swarm nodes: take less from the swarm (first generate every group here, then drop "
                       "other tokenizers, then other base models, "
                       "then all peers) while held-out accuracy is significantly below its best, return when "
                       "it recovers (ftis_edge/run/guard.py; a node alone is never touched)")
    guard_alpha: float = _opt(0.05, "the guard's significance level (one-sided exact McNemar test on the "
                              "same prompts)", lo=0.0001, hi=0.5)


def _host() -> str:
    return socket.gethostname().split(".")[0]


@dataclass
class Config:
    node: NodeSection = field(default_factory=NodeSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    task: TaskSection = field(default_factory=TaskSection)
    swarm: SwarmSection = field(default_factory=SwarmSection)
    eval: EvalSection = field(default_factory=EvalSection)

    # --- derived ------------------------------------------------------------------
    @property
    def node_id(self) -> str:
        if self.node.id:
            return self.node.id
        model = Path(self.model.spec).stem if self.model.spec.endswith(".gguf") else self.model.spec
        return f"{_host()}-{model.replace('/', '-')}"

    @property
    def model_label(self) -> str:
        """The model as the user named it (alias or hub id; a file or directory by its name),
        shown instead of the GGUF's internal name ("Smollm2 135M 8k Lc100K Mix1 Ep2")."""
        spec = self.model.spec
        if spec.endswith(".gguf"):
            path = Path(spec).expanduser()
            if path.stem in EXPORTED_STEMS:     # export's generic file name: called by its run's name
                folder = path.parent.parent if path.parent.name == "export" else path.parent
                return f"{folder.resolve().name or path.stem}-{path.stem[len('model-'):]}"
            return path.stem
        if spec.startswith(("/", ".", "~")) or Path(spec).expanduser().is_dir():
            return Path(spec).expanduser().name
        return spec

    @property
    def run_path(self) -> Path:
        return Path(self.node.run_dir.replace("{id}", self.node_id)).expanduser()

    @property
    def mode(self) -> str:
        """The collaboration actually in force: alone when no relay is configured."""
        return self.swarm.collaboration if self.swarm.relay else "alone"

    def to_dict(self) -> dict:
        return {s.name: {f.name: getattr(getattr(self, s.name), f.name) for f in fields(getattr(self, s.name))}
                for s in fields(self)}


SECTIONS = {f.name: f.default_factory for f in fields(Config)}


def _check_value(key: str, value: Any, f) -> Any:
    meta = f.metadata
    kind = meta.get("kind")
    if kind in ("list[str]", "list[int]"):
        want = str if kind == "list[str]" else int
        if not isinstance(value, list) or not all(isinstance(v, want) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{key}: expected a list of {want.__name__}, got {value!r}")
        return list(value)
    if kind == "table":
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    expected = type(f.default)
    if kind == "number_or_auto":
        if value == "auto":
            return value
        if isinstance(value, str):
            raise ConfigError(f'{key}: expected a number or "auto", got {value!r}')
        expected = float
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)          # TOML `learning_rate = 1` means 1.0
    # bool is an int subclass: `rounds = true` must not pass as 1.
    if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
        raise ConfigError(f"{key}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{key}: must be one of {', '.join(meta['choices'])}; got {value!r}")
    if meta.get("lo") is not None and value < meta["lo"]:
        raise ConfigError(f"{key}: must be >= {meta['lo']}, got {value!r}")
    if meta.get("hi") is not None and value > meta["hi"]:
        raise ConfigError(f"{key}: must be <= {meta['hi']}, got {value!r}")
    return value


# Keys renamed to TRL GRPOConfig's names after 0.1.0: an old key gets a did-you-mean, not a silent miss.
RENAMED = {
    "task.group_size": "task.num_generations",
    "task.max_new_tokens": "task.max_completion_length",
    "train.lr": "train.learning_rate",
    "train.eps": "train.epsilon",
    "train.grad_clip": "train.max_grad_norm",
}


def _unknown(key: str, known: list[str]) -> ConfigError:
    if key in RENAMED:
        return ConfigError(f"{key}: renamed to TRL's name (did you mean '{RENAMED[key]}'?)")
    close = difflib.get_close_matches(key.split(".")[-1], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"{key}: unknown setting{hint}")


def from_dict(data: dict) -> Config:
    """Validate a nested dict (as parsed from TOML) into a Config; errors name the key."""
    if not isinstance(data, dict):
        raise ConfigError("config: expected a table of sections")
    cfg = Config()
    for section, values in data.items():
        if section not in SECTIONS:
            raise _unknown(section, list(SECTIONS))
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: expected a [{section}] table, got {values!r}")
        obj = getattr(cfg, section)
        by_name = {f.name: f for f in fields(obj)}
        updates = {}
        for key, value in values.items():
            if key not in by_name:
                raise _unknown(f"{section}.{key}", list(by_name))
            updates[key] = _check_value(f"{section}.{key}", value, by_name[key])
        setattr(cfg, section, replace(obj, **updates))
    _cross_checks(cfg)
    return cfg


def _cross_checks(cfg: Config) -> None:
    if cfg.train.other_tokenizer_peers and not cfg.train.other_tokenizer:
        raise ConfigError("train.other_tokenizer_peers names the peers whose other-tokenizer text trains, but "
                          "train.other_tokenizer is off (nothing of it trains); turn it on or drop the list")
    if any(not str(n).strip() for n in cfg.train.other_tokenizer_peers):
        raise ConfigError("train.other_tokenizer_peers: node ids, none of them empty")
    if cfg.swarm.collaboration == "horizontal" and cfg.swarm.relay and cfg.task.num_generations % 2:
        raise ConfigError("task.num_generations: horizontal mode splits each group across nodes; use an even size")
    if cfg.swarm.prompt_choice == "outcomes" and cfg.mode == "horizontal":
        raise ConfigError("swarm.prompt_choice = \"outcomes\": horizontal swarms work on the same prompts "
                          "(a function of the swarm and the round); use \"stream\" or collaboration = \"vertical\"")
    if cfg.swarm.fill == "kin" and cfg.mode != "alone" and (cfg.mode != "vertical" or not cfg.swarm.own_groups):
        raise ConfigError("swarm.fill = \"kin\" decides which peers fill own slots: it needs batch fill "
                          "(collaboration = \"vertical\" and swarm.own_groups >= 1)")
    if cfg.swarm.hints and cfg.mode == "horizontal":
        raise ConfigError("swarm.hints: a hinted group is this node's alone, and horizontal nodes split each group; "
                          "use collaboration = \"vertical\"")
    if cfg.swarm.own_groups > cfg.task.prompts_per_round:
        raise ConfigError(f"swarm.own_groups: at most task.prompts_per_round ({cfg.task.prompts_per_round}) "
                          f"own groups a round; got {cfg.swarm.own_groups}")
    if bool(cfg.swarm.client_keys) != bool(cfg.swarm.server_key):
        raise ConfigError("swarm.server_key: CURVE needs both swarm.client_keys and swarm.server_key")
    for key in ("client_keys", "server_key"):
        p = getattr(cfg.swarm, key)
        if p and not Path(p).expanduser().exists():
            raise ConfigError(f"swarm.{key}: {p} does not exist")
    if cfg.task.path and not Path(cfg.task.path).expanduser().exists():
        raise ConfigError(f"task.path: {cfg.task.path} does not exist")
    problem = name_problem(cfg.task.name)       # syntax only: the task package (its grader) stays unloaded
    if problem:
        raise ConfigError(f"task.name: {problem}")
    if cfg.task.eval_path and not Path(cfg.task.eval_path).expanduser().exists():
        raise ConfigError(f"task.eval_path: {cfg.task.eval_path} does not exist")
    if cfg.swarm.relay:
        split_relay(cfg.swarm.relay)


def split_relay(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` relay address (None for ipc:// and inproc://);
    ConfigError in one line for anything else, so a typo never becomes "no answer for 4 s"."""
    if address.startswith(("ipc://", "inproc://")):
        return None
    expected = f"swarm.relay: expected tcp://host:port (port 1-65535), got {address!r}"
    if not address.startswith("tcp://"):
        raise ConfigError(expected)
    rest = address[len("tcp://"):]
    if rest.startswith("["):                       # an IPv6 literal: tcp://[::1]:5555
        host, sep, port = rest[1:].partition("]:")
    else:
        host, sep, port = rest.rpartition(":")
    if not sep or not host or any(c in host for c in "/;*? ") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(expected)
    return host, int(port)


def resolve_relay(address: str) -> None:
    """At start-up: ConfigError when the relay's host name does not resolve (a DNS typo, no
    network) rather than a node that waits for an answer that cannot come."""
    parts = split_relay(address)
    if parts is None:
        return
    host, port = parts
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"swarm.relay: cannot resolve {host} ({getattr(e, 'strerror', None) or e})") from None


def load(path: str | os.PathLike | None, overrides: dict | None = None) -> Config:
    """Read ``path`` (None = all defaults), apply ``overrides`` ({"swarm.relay": ...}), validate."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: no such config file (create one with `ftis-edge init {p}`)")
        if not p.is_file():                      # a FIFO would block the read for ever
            raise ConfigError(f"{p}: not a regular file")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            twice = re.search(r"Cannot declare \('?([^)]*?)'?,?\) twice(.*)", str(e))
            if twice:       # a README [task] block pasted below the one `ftis-edge init` wrote
                section = ".".join(part.strip(" '") for part in twice.group(1).split(","))
                raise ConfigError(f"{p}: [{section}] appears twice{twice.group(2)}: a file from `ftis-edge init` "
                                  f"already has every section; replace that [{section}] instead of adding "
                                  f"another (or write the file with `ftis-edge init --task NAME`)") from None
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        except RecursionError:                   # tomllib recurses once per nesting level
            raise ConfigError(f"{p}: nested too deeply to be a config") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{p}: not a UTF-8 text file") from None
        _relative_to(data, p.expanduser().resolve().parent)
    for dotted, value in (overrides or {}).items():        # the command line's: relative to where it runs
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    cfg = from_dict(data)
    if path is not None and not cfg.node.id:
        # alice.toml and bob.toml on one PC: two ids, two run directories, without naming either
        cfg.node = replace(cfg.node, id=f"{_host()}-{Path(path).stem}")
    return cfg


# Paths a node file names: relative ones mean relative to the file's folder (the same file started
# from two folders is one run, and an error names the absolute path).
FILE_PATHS = (("node", "run_dir"), ("task", "path"), ("task", "eval_path"), ("swarm", "client_keys"),
              ("swarm", "server_key"))


def _relative_to(data: dict, folder: Path) -> None:
    for section, key in FILE_PATHS:
        value = (data.get(section) or {}).get(key) if isinstance(data.get(section), dict) else None
        if isinstance(value, str) and value and not value.startswith("~") and not Path(value).is_absolute():
            data[section][key] = os.path.normpath(folder / value)
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    spec = model.get("spec")
    if isinstance(spec, str) and spec.startswith(("./", "../")):     # a hub id (org/name) stays as it is
        model["spec"] = str((folder / spec).resolve())


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def to_toml(cfg: Config, *, comments: bool = True) -> str:
    """The config as TOML; with comments, every setting is preceded by its doc and choices."""
    lines = []
    if comments:
        lines += ["# ftis-edge node configuration — every setting shown with its default.",
                  "# Run with: ftis-edge start node.toml        Docs: docs/config.md", ""]
    for s in fields(cfg):
        section = getattr(cfg, s.name)
        lines.append(f"[{s.name}]")
        for f in fields(section):
            if comments:
                doc = f.metadata.get("doc", "")
                if f.metadata.get("choices"):
                    doc += f"  [{' | '.join(f.metadata['choices'])}]"
                lines.append(f"# {doc}")
            lines.append(f"{f.name} = {_toml_value(getattr(section, f.name))}")
        lines.append("")
    return "\n".join(lines)


def reference_table() -> str:
    """Markdown table of every setting (for docs/config.md)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    cfg = Config()
    for s in fields(cfg):
        section = getattr(cfg, s.name)
        for f in fields(section):
            doc = f.metadata.get("doc", "")
            if f.metadata.get("choices"):
                sep = "` \\| `"
                doc += " (`" + sep.join(f.metadata["choices"]) + "`)"
            rows.append(f"| `{s.name}.{f.name}` | `{_toml_value(getattr(section, f.name))}` | {doc} |")
    return "\n".join(rows)


def trl_table() -> str:
    """Markdown table: every setting that has a TRL ``GRPOConfig`` counterpart (for docs/trl.md)."""
    rows = ["| ftis-edge key | TRL `GRPOConfig` | same meaning? |", "|---|---|---|"]
    for s in fields(Config):
        for f in fields(s.default_factory):
            trl = f.metadata.get("trl")
            if trl:
                note = TRL_NOTES.get(f"{s.name}.{f.name}", "yes")
                rows.append(f"| `{s.name}.{f.name}` | `{trl}` | {note} |")
    return "\n".join(rows)


# Where a setting only resembles its TRL counterpart (everything else in trl_table is the same).
TRL_NOTES = {
    "node.rounds": "yes: one round = one optimiser step (plus generation and sharing)",
    "train.C": "close: TRL caps its vLLM sampler-mismatch IS ratio; here C caps the IS weight of every "
               "off-policy sample (own generator, peers)",
    "train.advantage_scale": "close: `std` = TRL's `\"group\"` (True), `none` = `\"none\"` (False); "
                             "TRL's `\"batch\"` has no counterpart",
    "train.max_grad_norm": "yes (0 = off here)",
    "train.precision": "close: `bf16` = TRL's `bf16=True` (autocast); `auto` picks it on CUDA only, where TRL's "
                       "default follows the hardware too",
    "eval.every": "close: TRL evaluates every `eval_steps` (with `eval_strategy=\"steps\"`) by sampling and logs eval "
                  "reward; here greedy held-out accuracy with its interval, also at round 0 and the end (0 = off)",
}
