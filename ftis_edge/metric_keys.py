"""Every key of a round record, in one table: name, meaning, and how it combines over micro-batches.

The objective emits per-micro-batch stats; ``learner.aggregate_stats`` combines them with the
rule registered here (an unregistered stat is an error, never silently averaged). The node,
the dashboard and docs/metrics.md (generated: ``python docs/make_metrics_doc.py``) use these
names. Names are TRL's (GRPOTrainer's logged metrics) where TRL has the same concept; the
``trl`` column says which, and docs/trl.md lists them with the config keys.
"""
from __future__ import annotations

from dataclasses import dataclass

# How a stat combines over the micro-batches of one step.
SUM = "sum"                  # counts, and the loss (each micro-batch's part is already /N)
MEAN = "mean"                # mean weighted by the micro-batch's sample count
TOKEN_MEAN = "token_mean"    # mean weighted by the micro-batch's token count
SPAN_MEAN = "span_mean"      # mean weighted by the micro-batch's span count (stat "spans")
MAX = "max"
FRACTION = "fraction"        # exactly: the summed count ``of`` / the summed samples
PER_SAMPLE = "per_sample"    # recomputed exactly from the step's per-sample tensors
# Not combined over micro-batches: written once.
STEP = "step"                # by the learner, once per step
ROUND = "round"              # by the node, once per round
MICRO_BATCH_RULES = (SUM, MEAN, TOKEN_MEAN, SPAN_MEAN, MAX, FRACTION, PER_SAMPLE)
RULE_TEXT = {SUM: "sum", MEAN: "mean over samples", TOKEN_MEAN: "mean over tokens",
             SPAN_MEAN: "mean over spans", MAX: "max",
             FRACTION: "count ÷ samples", PER_SAMPLE: "exact, from per-sample values",
             STEP: "once per step", ROUND: "once per round"}


@dataclass(frozen=True)
class Metric:
    name: str
    meaning: str
    rule: str
    trl: str = ""            # TRL GRPOTrainer's name for the same quantity ("" = none)
    of: str = ""             # FRACTION: the count it divides


def _m(name, meaning, rule, trl="", of=""):
    return Metric(name, meaning, rule, trl=trl, of=of)


# Grouped as docs/metrics.md shows them.
SECTIONS: dict[str, list[Metric]] = {
    "Round": [
        _m("round", "round number, 1-based", ROUND),
        _m("paused", "true when the round was preceded by a pause", ROUND),
        _m("peers", "`{node_id: {...}}` per-peer stats, cumulative (see below)", ROUND),
    ],
    "Rewards": [
        _m("reward/own", "mean reward of own completions", ROUND),
        _m("reward/peers", "mean reward of accepted peer completions (regraded locally)", ROUND),
        _m("reward", "mean reward of all completions of the round (own + accepted peers')", ROUND, trl="reward"),
        _m("accuracy/own", "fraction of own completions that are correct", ROUND),
        _m("format/own", "fraction of own completions in the required format", ROUND),
        _m("reward/timed_out", "own completions scored 0 because grading ran out of its budget "
           "(task.reward_timeout_s; a machine too busy for the budget)", ROUND),
        _m("frac_reward_zero_std", "fraction of the round's groups whose rewards were all equal "
           "(no signal: skipped)", ROUND, trl="frac_reward_zero_std"),
        _m("groups/with_peer_parts", "horizontal mode: own groups merged with peers' parts (else null)", ROUND),
    ],
    "Batch": [
        _m("samples", "samples in the step's batch (0 when the round had nothing to learn from)", SUM),
        _m("samples/own", "own samples in the batch", ROUND),
        _m("peers/samples_used", "peer samples in the batch", ROUND),
        _m("samples/empty", "samples with no completion tokens", SUM),
        _m("samples/sequence_level", "cross-tokenizer samples (one IS weight per sequence)", SUM),
        _m("samples/span_level", "cross-tokenizer samples weighted per span between shared byte boundaries",
           SUM),
        _m("spans", "spans of the span-level samples", SUM),
        _m("tokens", "completion tokens in the batch", SUM),
    ],
    "Objective (F-TIS step)": [
        _m("loss", "F-TIS objective value of the step", SUM, trl="loss"),
        _m("filter/dropped", "samples dropped by the F- filter (Â ≤ 0 and KL > g)", SUM),
        _m("filter/dropped_frac", "`filter/dropped` ÷ `samples`", FRACTION, of="filter/dropped"),
        _m("filter/kept", "non-empty samples the filter kept", SUM),
        _m("filter/adv_le0", "samples with Â ≤ 0 (the filter's first condition; not all are dropped)", SUM),
        _m("filter/adv_le0_frac", "`filter/adv_le0` ÷ `samples`", FRACTION, of="filter/adv_le0"),
        _m("filter/kl_gt_g", "samples with KL > g (the filter's second condition)", SUM),
        _m("filter/kl_gt_g_frac", "`filter/kl_gt_g` ÷ `samples`", FRACTION, of="filter/kl_gt_g"),
        _m("sampling/importance_sampling_ratio/mean",
           "truncated IS weight min(π_θ/π_gen, C): per-sample token mean, mean over non-empty samples",
           PER_SAMPLE, trl="sampling/importance_sampling_ratio/mean"),
        _m("sampling/importance_sampling_ratio/max", "largest truncated IS weight of any token", MAX,
           trl="sampling/importance_sampling_ratio/max"),
        _m("is/truncated_frac", "fraction of tokens whose IS weight hit the cap C", TOKEN_MEAN),
        _m("is/ess", "effective sample size of the per-sample IS weights, as a fraction of samples", PER_SAMPLE),
        _m("kl/mean", "k3 KL between learner and generator, per sample, mean over non-empty samples",
           PER_SAMPLE),
        _m("kl/max", "largest per-sample k3 KL", MAX),
        _m("sampling/sampling_logp_difference/mean", "mean per-token abs(ℓ − g) over token-level samples",
           TOKEN_MEAN, trl="sampling/sampling_logp_difference/mean"),
        _m("sampling/span_logp_difference/mean", "mean per-span abs(L_k − G_k) over span-level samples "
           "(learner's vs generator's log-prob of the span's bytes)", SPAN_MEAN),
        _m("clip_ratio/region_mean", "fraction of tokens where the PPO clip is active (tis, vis, f-vis)",
           TOKEN_MEAN, trl="clip_ratio/region_mean"),
    ],
    "Optimiser": [
        _m("grad_norm", "gradient norm before clipping (absent when the step was skipped)", STEP, trl="grad_norm"),
        _m("learning_rate", "Adam learning rate", ROUND, trl="learning_rate"),
        _m("skipped", "1 when no optimiser step ran (no signal, or everything filtered)", STEP),
        _m("no_signal", "1 when every advantage in the batch was zero", STEP),
        _m("micro_batches", "micro-batches the step was split into", STEP),
        _m("trust/implausible", "peer samples not trained on: their worst window of text is far less "
           "likely under the learner than its own completions are (plausibility.py)", STEP),
        _m("trust/repeated_tokens", "peer tokens not trained on: they repeat an unlikely n-gram an earlier "
           "peer sample already taught (plausibility.RepeatMemory)", STEP),
        _m("trust/threshold", "the plausibility threshold of the step (nats per token of excess "
           "log-prob), calibrated on own completions", STEP),
        _m("version", "the learner's weight version after the step", STEP),
        _m("micro_batch", "samples per micro-batch (halved on out-of-memory)", ROUND),
        _m("memory/oom_retries", "out-of-memory retries so far (cumulative)", ROUND),
    ],
    "Generation": [
        _m("gen/tokens", "completion tokens generated by this node this round", ROUND),
        _m("gen/tok_s", "own generation throughput (tokens/s)", ROUND),
        _m("completions/mean_length", "mean length of own completions (tokens)", ROUND,
           trl="completions/mean_length"),
    ],
    "Weight sync": [
        _m("sync/version", "weight version the generator now runs", ROUND),
        _m("sync/bytes", "bytes written for the generator (adapter or weights)", ROUND),
        _m("sync/write_s", "time to write the weights", ROUND),
        _m("sync/apply_s", "time for the generator to load them", ROUND),
    ],
    "Swarm": [
        _m("wire/bytes_per_token_out", "bytes published per own completion token", ROUND),
        _m("wire/bytes_per_token_in", "bytes received per peer completion token", ROUND),
        _m("peers/groups_received", "peer groups that arrived this round", ROUND),
        _m("peers/groups_used", "peer groups taken into this round's batch (vertical: informative ones first, "
           "at most `swarm.max_groups_per_peer` of one peer)", ROUND),
        _m("peers/rejected", "peer groups rejected by intake this round", ROUND),
        _m("peers/stale", "peer groups too old to use this round", ROUND),
        _m("peers/skipped_zero_advantage", "fresh peer groups not taken: all re-graded rewards equal "
           "(zero advantage, nothing to learn; dropped)", ROUND),
        _m("peers/skipped_peer_cap", "fresh informative peer groups not taken: over `swarm.max_groups_per_peer` "
           "of their peer (kept for a later round while fresh)", ROUND),
        _m("peers/skipped_surplus", "fresh informative peer groups not taken: the batch was full "
           "(kept for a later round while fresh)", ROUND),
        _m("peers/share", "share of the round's trained groups that peers supplied", ROUND),
        _m("relay/connected", "relay client connected", ROUND),
        _m("relay/state", "relay client health: connecting, connected, unreachable or refused", ROUND),
        _m("relay/reason", "why the relay is not connected (one line; null when connected)", ROUND),
        _m("relay/latency_ms", "heartbeat round trip to the relay", ROUND),
        _m("relay/replayed", "rollouts the relay replayed to us (cumulative)", ROUND),
    ],
    "Compute (batch fill and what the swarm saves)": [
        _m("groups/own", "own groups generated this round (batch fill: the minimum + any top-up)", ROUND),
        _m("groups/topped_up", "own groups generated because the swarm supplied fewer than the batch's "
           "peer slots within `swarm.max_wait_s` (batch fill; else 0)", ROUND),
        _m("peers/saved_frac", "cumulative: share of all groups trained on so far that peers supplied in "
           "place of own generation (batch fill; null when it is off)", ROUND),
        _m("gen/tokens_total", "cumulative own completion tokens generated (survives --resume)", ROUND),
        _m("cpu/gen_s", "process CPU-seconds (all threads) generating own completions", ROUND),
        _m("cpu/grade_s", "process CPU-seconds grading own completions (the grader worker process "
           "not included)", ROUND),
        _m("cpu/intake_s", "process CPU-seconds receiving, checking and re-grading peers' groups and "
           "publishing own", ROUND),
        _m("cpu/train_s", "process CPU-seconds of the optimiser step", ROUND),
        _m("cpu/sync_s", "process CPU-seconds of the weight sync to the generator", ROUND),
        _m("cpu/round_s", "process CPU-seconds of the whole round (phases + what lies between)", ROUND),
        _m("cpu/total_s", "cumulative process CPU-seconds of all rounds (survives --resume)", ROUND),
    ],
    "Held-out eval (ftis_edge/heldout.py; only in rounds with an eval: every `eval.every` and the last)": [
        _m("eval/accuracy", "greedy held-out accuracy: share of the `eval/n` held-out prompts answered correctly "
           "in the required format (reward 1), with the weights after this round's step", ROUND),
        _m("eval/accuracy_lo", "lower end of its 95% Wilson interval", ROUND),
        _m("eval/accuracy_hi", "upper end of its 95% Wilson interval", ROUND),
        _m("eval/format", "share of held-out answers in the required format", ROUND),
        _m("eval/truncated", "share of held-out answers cut at `task.max_completion_length`", ROUND),
        _m("eval/n", "held-out prompts (the first `eval.prompts` of the task's eval split, the same every eval)",
           ROUND),
        _m("eval/round", "the round whose weights were evaluated (0 = the base model)", ROUND),
        _m("eval/change", "paired change of accuracy against the base model (round 0) on the same prompts "
           "(gained − lost) ÷ n", ROUND),
        _m("eval/change_se", "standard error of `eval/change`: √(lost + gained − (gained − lost)²/n) ÷ n", ROUND),
        _m("eval/change_lo", "lower end of the 95% interval of `eval/change` (± 1.96 SE)", ROUND),
        _m("eval/change_hi", "upper end of the 95% interval of `eval/change`", ROUND),
        _m("eval/best_accuracy", "the best held-out accuracy so far (its weights are kept: "
           "`checkpoints/best-NNNNNN/`, what `ftis-edge export` takes)", ROUND),
        _m("eval/best_round", "the round of that best eval", ROUND),
        _m("eval/seconds", "wall seconds of the eval (generation + grading)", ROUND),
        _m("eval/tokens", "tokens the eval generated", ROUND),
        _m("eval/base_accuracy", "the base model's held-out accuracy (round 0; in round 1's record and every eval's)",
           ROUND),
        _m("eval/base_lo", "round 1's record: lower end of the base accuracy's 95% Wilson interval", ROUND),
        _m("eval/base_hi", "round 1's record: upper end of that interval", ROUND),
        _m("eval/base_format", "round 1's record: the base model's format rate on the held-out prompts", ROUND),
        _m("eval/base_truncated", "round 1's record: the base model's share of answers cut at the length cap",
           ROUND),
        _m("eval/base_seconds", "round 1's record: wall seconds of the base model's eval", ROUND),
        _m("time/eval_s", "wall seconds of this round's held-out eval(s), weights kept included "
           "(not part of `time/round_s`)", ROUND),
    ],
    "Swarm guard (ftis_edge/guard.py; swarm nodes with `eval.guard`)": [
        _m("swarm/guard", "the guard's decision at this round's eval, one line with the evidence (accuracy vs "
           "best on the same prompts, prompts lost / gained, McNemar p) and the action", ROUND),
        _m("swarm/guard_level", "what the node takes from the swarm: 0 all peers, 1 none of another tokenizer, "
           "2 none of another tokenizer or base model, 3 none (training alone)", ROUND),
        _m("swarm/guard_excluded", "peer groups this round that the guard's level kept out of training", ROUND),
    ],
    "Time": [
        _m("time/gen_s", "generation and grading of own groups", ROUND),
        _m("time/peer_wait_s", "waiting for peers' groups", ROUND),
        _m("time/train_s", "the optimiser step", ROUND),
        _m("time/sync_s", "weight sync to the generator", ROUND),
        _m("time/round_s", "the whole round", ROUND),
    ],
}

METRICS: dict[str, Metric] = {m.name: m for ms in SECTIONS.values() for m in ms}

# Keys every record has (written by MetricsWriter), not metrics.
RECORD_KEYS = ("type", "time")

# Fields of each entry of a round record's ``peers`` (intake.PeerStats.as_dict).
PEER_FIELDS = {
    "model": "the peer's model name", "tokenizer": "its tokenizer fingerprint",
    "last_seen": "unix time of its latest rollout", "sent": "rollouts that reached us",
    "accepted": "rollouts that passed intake", "rejected": "rollouts intake rejected",
    "rejected_by_reason": "`{reason: count}`", "acceptance_rate": "`accepted` ÷ `sent`",
    "samples_used": "its samples we trained on", "kl_mean": "mean k3 KL of those samples",
    "is_weight_mean": "mean IS weight of those samples", "filter_rate": "fraction of them the filter dropped",
    "grader_timeouts": "completions our grader timed out on", "reward_mismatches": "claimed reward ≠ our grade",
    "recent_reject_rate": "refused fraction of its last `swarm.quarantine_window` rollouts",
    "model_fp": "its model fingerprint", "fingerprint_changes": "times its model / tokenizer fingerprint changed",
    "fingerprint_change": "the latest change (\"tokenizer a -> b\")",
    "quarantined": "true once ignored for repeated bad rollouts",
    "quarantine_reason": "why it was quarantined (\"16 of its last 20 rollouts refused (bad_logprob 16)\")",
}


class UnregisteredMetric(KeyError):
    """A stat name that is not in ``METRICS`` (register it, with its aggregation rule)."""


def rule(name: str) -> str:
    """The aggregation rule of a registered metric; UnregisteredMetric otherwise."""
    try:
        return METRICS[name].rule
    except KeyError:
        raise UnregisteredMetric(f"metric {name!r} is not registered in ftis_edge/metric_keys.py "
                                 "(add it with its meaning and aggregation rule)") from None


def unregistered(record: dict) -> list[str]:
    """The keys of a round record that are not registered (an empty list when all are)."""
    return [k for k in record if k not in METRICS and k not in RECORD_KEYS]


# ---------------------------------------------------------------------------- generated docs

_START_FIELDS = ("`node_id`, `model` (as the user named it: alias, hub id, file or directory name), "
                 "`model_name` (the name inside the GGUF / HF config), `tokenizer_fp`, `model_fp`, "
                 "`backend` (resolved: `llamacpp` or `hf`), `trainable` (`\"lora\"`/`\"full\"`), `method`, "
                 "`collaboration`, `relay` (address or null), `resumed_from` (round or null), `config` (the full "
                 "resolved config as a dict: `node.id` is the effective id, `model.device` / `model.backend` "
                 "what \"auto\" chose).")


def render_metrics_doc() -> str:
    """docs/metrics.md, from the table above (``python docs/make_docs.py`` writes it)."""
    out = ["# Metrics: `RUN_DIR/metrics.jsonl`", "",
           "<!-- generated from ftis_edge/metric_keys.py by `python docs/make_docs.py`; edit there -->", "",
           "One JSON object per line (see `ftis_edge/metrics.py`). Every line has `type` and `time`",
           "(unix seconds). Missing values are `null` (never NaN). Names are TRL's (GRPOTrainer's",
           "logged metrics) where TRL has the same quantity — see [trl.md](trl.md).", "",
           "## `{\"type\": \"start\"}` — once when a node starts (or resumes)", _START_FIELDS, "",
           "## `{\"type\": \"round\"}` — one per round", "",
           "*Aggregation* says how the learner combines a stat over one step's micro-batches; "
           "\"once per step\" keys are set by the learner after the step, \"once per round\" keys by the node. "
           "A stat the objective emits must be registered in `ftis_edge/metric_keys.py` with its rule, "
           "or the step fails.", ""]
    for section, metrics in SECTIONS.items():
        out += [f"### {section}", "", "| key | meaning | aggregation |", "|---|---|---|"]
        out += [f"| `{m.name}` | {m.meaning} | {RULE_TEXT[m.rule]} |" for m in metrics]
        out.append("")
    out += ["### `peers`: one entry per peer node, cumulative since the node started", "",
            "| field | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in PEER_FIELDS.items()]
    out += ["", "## `{\"type\": \"stop\"}` — when a node stops cleanly",
            "`round`, `reason` (`\"steps\"`, `\"user\"`, `\"signal\"`).", "",
            "## `RUN_DIR/node.log`",
            "Plain text log lines (`HH:MM:SS level message`), what `--headless` prints.", "",
            "## `RUN_DIR/control.json`",
            "`{\"pause\": bool, \"stop\": bool}`, written atomically by the dashboard (`p`, `q`); the node reads",
            "it between rounds: `stop` ends the run after the current round with a checkpoint, `pause`",
            "waits before the next round.", "",
            "## `RUN_DIR/progress.json`",
            "What the node is doing now (`ftis_edge/progress.py`), replaced atomically when it enters a phase and",
            "at most every 0.5 s inside one: `phase` (loading, generating, grading, waiting for peers, training,",
            "syncing, checkpointing, paused, stopped), `round`, `round_started`, `since`, `time`, `pid`, and per",
            "phase `done` / `total`, `tok_s`, `deadline`, `samples`, `what` / `last_s` (loading), `reason` (stopped).",
            "The dashboard's phase, round bar and ETA come from it (docs/tui.md).", ""]
    return "\n".join(out)


# TRL metrics with a near but not equal counterpart here (shown in docs/trl.md).
TRL_NEAR = [
    ("num_tokens", "`tokens`, `gen/tokens`, `gen/tokens_total`",
     "TRL counts prompt + completion tokens seen since the start; here: completion tokens per step / "
     "generated per round / generated by this node since the start"),
    ("kl", "`kl/mean`", "TRL: KL to the reference model (β term); here: k3 KL between learner and generator"),
    ("reward_std", "—", "not logged (rewards are summarised per group by `frac_reward_zero_std`)"),
    ("clip_ratio/low_mean, clip_ratio/high_mean", "`clip_ratio/region_mean`", "one fraction for both sides"),
]


def render_trl_doc() -> str:
    """docs/trl.md: ftis-edge config keys and metric names next to TRL GRPOTrainer's."""
    from .config import RENAMED, trl_table

    out = ["# ftis-edge ↔ TRL names", "",
           "<!-- generated by `python docs/make_docs.py` from ftis_edge/config.py and ftis_edge/metric_keys.py -->",
           "", "Where a setting or a metric means what TRL's `GRPOConfig` field or `GRPOTrainer` metric means, "
           "it has TRL's name.", "", "## Config keys", "", trl_table(), "",
           "Renamed after 0.1.0 (an old key in a node file stops the node with a did-you-mean):", ""]
    out += [f"* `{old}` → `{new}`" for old, new in RENAMED.items()]
    out += ["", "## Metrics", "", "Same name, same quantity:", "", "| metric | meaning |", "|---|---|"]
    out += [f"| `{m.name}` | {m.meaning} |" for m in METRICS.values() if m.trl == m.name]
    out += ["", "Near, but not the same (so not renamed):", "", "| TRL | ftis-edge | difference |", "|---|---|---|"]
    out += [f"| `{t}` | {ours} | {why} |" for t, ours, why in TRL_NEAR]
    out += ["", "Renamed after 0.1.0 (records written before keep the old names):", ""]
    out += [f"* `{old}` → `{new}`" + (f" ({why})" if why else "") for old, (new, why) in RENAMED_METRICS.items()]
    out.append("")
    return "\n".join(out)


# Metric keys renamed after 0.1.0 (records written before keep the old names), with why when
# the rename is more than TRL's name.
RENAMED_METRICS = {
    "lr": ("learning_rate", ""),
    "reward/mean": ("reward", ""),
    "gen/mean_len": ("completions/mean_length", ""),
    "clip_frac": ("clip_ratio/region_mean", ""),
    "is/weight_mean": ("sampling/importance_sampling_ratio/mean", ""),
    "is/weight_max": ("sampling/importance_sampling_ratio/max", ""),
    "mismatch/abs_logp_diff": ("sampling/sampling_logp_difference/mean", ""),
    "filter/dropped_adv_rule": ("filter/adv_le0", "it counts Â ≤ 0, not drops"),
    "filter/dropped_kl_rule": ("filter/kl_gt_g", "it counts KL > g, not drops"),
    "groups/skipped_equal_reward": ("frac_reward_zero_std", "a count became a fraction of the round's groups"),
    "samples/peers": ("peers/samples_used", "it was a duplicate of it"),
}
