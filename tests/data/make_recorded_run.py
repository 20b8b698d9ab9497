"""Write tests/data/recorded_run/: a plausible, deterministic 30-round record of a small swarm.

The dashboard is built and tested against this record before a real node exists. It has
every key of docs/metrics.md and the situations the dashboard must show:

* own node ``smol-node``: SmolLM2-135M-Instruct, LoRA, llama.cpp generator, task ``arith``;
* peer ``gemma-node``: Gemma 3 270M (another tokenizer), joins at round 2, a few stale groups;
* peer ``mallory``: hostile, claims wrong rewards and sends broken log-probs from round 4,
  quarantined at round 6, ignored afterwards;
* round 1 has no peer data (nulls), the relay drops at round 12 and replays at round 13,
  an OOM retry halves the micro-batch at round 9, the user pauses before round 18.

Seeded, so the numbers are the same on every run:  python tests/data/make_recorded_run.py
"""
from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from ftis_edge.metrics import LOG_FILE, METRICS_FILE, MetricsWriter  # noqa: E402

OUT_DIR = HERE / "recorded_run"
ROUNDS = 30
T0 = 1764403200.0            # 2025-11-29 08:00:00 UTC: a fixed clock keeps the record reproducible
GROUP_SIZE = 8
PROMPTS_PER_ROUND = 8
OWN_SAMPLES = GROUP_SIZE * PROMPTS_PER_ROUND

CONFIG = {
    "node": {"id": "smol-node", "run_dir": "runs/smol-node"},
    "model": {"name": "SmolLM2-135M-Instruct", "backend": "llamacpp", "trainable": "lora",
              "lora_rank": 16, "lora_alpha": 32},
    "task": {"name": "arith", "group_size": GROUP_SIZE, "prompts_per_round": PROMPTS_PER_ROUND,
             "max_new_tokens": 96, "temperature": 1.0},
    "train": {"method": "ftis", "steps": ROUNDS, "lr": 2e-5, "micro_batch": 8,
              "is_cap": 2.0, "kl_gate": 0.1, "seed": 7},
    "swarm": {"collaboration": "swarm", "relay": "tcp://192.168.1.20:5555", "topic": "arith-smol",
              "max_staleness": 2},
}


def _fp(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def config_toml(config: dict) -> str:
    """The two-level config as TOML (tables of scalars are all this record needs)."""
    lines = []
    for table, values in config.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def _r(x: float, nd: int = 4) -> float:
    return round(x, nd)


def make_records(seed: int = 1234) -> tuple[list[dict], list[str]]:
    """All metrics records (start, 30 rounds, stop) and the node.log lines."""
    rng = random.Random(seed)
    log: list[str] = []

    def say(t: float, level: str, msg: str) -> None:
        log.append(f"{time.strftime('%H:%M:%S', time.gmtime(t))} {level:<5} {msg}")

    start = {
        "type": "start", "time": T0, "node_id": "smol-node", "model": "SmolLM2-135M-Instruct",
        "tokenizer_fp": _fp("tokenizer:SmolLM2"), "model_fp": _fp("model:SmolLM2-135M-Instruct"),
        "backend": "llamacpp", "trainable": "lora", "method": "ftis", "collaboration": "swarm",
        "relay": CONFIG["swarm"]["relay"], "resumed_from": None, "config": CONFIG,
    }
    say(T0, "INFO", "ftis-edge 0.1.0 node smol-node starting (SmolLM2-135M-Instruct, lora, llamacpp)")
    say(T0, "INFO", f"relay {CONFIG['swarm']['relay']} connected, topic arith-smol")

    gemma = {"model": "gemma-3-270m-it", "tokenizer": "gemma3", "last_seen": None, "sent": 0,
             "accepted": 0, "rejected": 0, "rejected_by_reason": {}, "acceptance_rate": None,
             "kl_mean": None, "is_weight_mean": None, "filter_rate": None,
             "grader_timeouts": 0, "quarantined": False}
    mallory = {"model": "SmolLM2-135M-Instruct", "tokenizer": "SmolLM2", "last_seen": None,
               "sent": 0, "accepted": 0, "rejected": 0, "rejected_by_reason": {},
               "acceptance_rate": None, "kl_mean": None, "is_weight_mean": None,
               "filter_rate": None, "grader_timeouts": 0, "quarantined": False}
    records = [start]
    t = T0
    micro_batch = 8
    gemma_kls: list[float] = []
    for rnd in range(1, ROUNDS + 1):
        paused = rnd == 18
        if paused:
            say(t, "INFO", "paused by the dashboard")
            t += 42.0
            say(t, "INFO", "resumed")
        relay_up = rnd != 12
        gen_s = 11.0 + rng.uniform(-1.0, 1.5)
        mean_len = 58.0 + rng.uniform(-6, 6) - rnd * 0.4
        tokens = int(OWN_SAMPLES * mean_len)
        # Own rewards climb from ~0.3 towards ~0.65; reward = 0.9·correct + 0.1·format.
        p_correct = 0.28 + 0.34 * (1 - math.exp(-rnd / 11)) + rng.uniform(-0.05, 0.05)
        correct = sum(rng.random() < p_correct for _ in range(OWN_SAMPLES))
        formatted = max(correct, sum(rng.random() < 0.55 + rnd * 0.012 for _ in range(OWN_SAMPLES)))
        reward_own = (0.9 * correct + 0.1 * formatted) / OWN_SAMPLES

        # Peer intake of this round.
        g_groups = 0 if rnd == 1 or not relay_up else 2 + (rnd % 3 == 0)
        g_stale = 1 if rnd in (7, 13, 22) else 0
        g_rejected = g_stale
        g_accepted = g_groups - g_rejected if g_groups else 0
        m_groups = 3 if rnd >= 4 and relay_up else 0
        m_counted = m_groups if rnd <= 6 else 0      # once quarantined, its messages are dropped unread
        if g_groups:
            gemma["sent"] += g_groups
            gemma["accepted"] += g_accepted
            gemma["rejected"] += g_rejected
            gemma["last_seen"] = _r(t + rng.uniform(2, 9), 2)
            if g_stale:
                gemma["rejected_by_reason"]["stale"] = gemma["rejected_by_reason"].get("stale", 0) + g_stale
        if m_groups:
            mallory["last_seen"] = _r(t + rng.uniform(1, 5), 2)
        if m_counted:
            mallory["sent"] += m_counted
            mallory["rejected"] += m_counted
            reasons = mallory["rejected_by_reason"]
            reasons["reward_mismatch"] = reasons.get("reward_mismatch", 0) + 2
            reasons["bad_logprobs"] = reasons.get("bad_logprobs", 0) + 1
            if rnd == 5:
                reasons["grader_timeout"] = 1
                mallory["grader_timeouts"] = 1
            mallory["acceptance_rate"] = 0.0
            say(t, "WARN", "rejected 3 groups from mallory (reward_mismatch 2, bad_logprobs 1)")
        if rnd == 6:
            mallory["quarantined"] = True
            say(t, "WARN", "peer mallory quarantined: 9/9 rollouts rejected")
        if rnd == 2:
            say(t, "INFO", "new peer gemma-node (gemma-3-270m-it, tokenizer gemma3): re-tokenizing")

        peer_samples = g_accepted * GROUP_SIZE
        if peer_samples:
            correct_p = sum(rng.random() < 0.42 + rnd * 0.006 for _ in range(peer_samples))
            reward_peers = (0.9 * correct_p + 0.1 * peer_samples * 0.9) / peer_samples
            kl_round = 0.07 + rng.uniform(-0.02, 0.03)
            gemma_kls.append(kl_round)
            gemma["kl_mean"] = _r(sum(gemma_kls) / len(gemma_kls))
            gemma["is_weight_mean"] = _r(0.9 + rng.uniform(-0.05, 0.04))
            gemma["filter_rate"] = _r(0.5 + rng.uniform(-0.06, 0.08))
        else:
            reward_peers = None
        if gemma["sent"]:
            gemma["acceptance_rate"] = _r(gemma["accepted"] / gemma["sent"])
        samples = OWN_SAMPLES + peer_samples
        reward_mean = (reward_own * OWN_SAMPLES + (reward_peers or 0) * peer_samples) / samples

        adv_le0 = 0.46 + rng.uniform(-0.05, 0.05)
        kl_gt = (0.015 if not peer_samples else 0.05) + rng.uniform(0, 0.03)
        dropped = round(samples * (adv_le0 + kl_gt * (1 - adv_le0)))
        skipped = sum(rng.random() < 0.12 for _ in range(PROMPTS_PER_ROUND))
        if rnd == 9:
            micro_batch = 4
            say(t, "WARN", "out of memory at micro-batch 8: retrying with 4")
        train_s = (4.8 if micro_batch == 8 else 6.1) + samples * 0.012 + rng.uniform(-0.3, 0.3)
        sync_s = 0.35 + rng.uniform(0, 0.1)
        wait_s = rng.uniform(0.2, 1.4)
        round_s = gen_s + train_s + sync_s + wait_s
        has_is = rnd > 1                              # round 1: no previous policy, no IS statistics
        rec = {
            "type": "round", "round": rnd,
            "reward/own": _r(reward_own), "reward/peers": None if reward_peers is None else _r(reward_peers),
            "reward/mean": _r(reward_mean),
            "accuracy/own": _r(correct / OWN_SAMPLES), "format/own": _r(formatted / OWN_SAMPLES),
            "loss": _r(0.03 - 0.0012 * rnd + rng.uniform(-0.02, 0.02), 5),
            "samples": samples, "samples/own": OWN_SAMPLES, "samples/peers": peer_samples,
            "groups/skipped_equal_reward": skipped,
            "filter/dropped": dropped, "filter/dropped_frac": _r(dropped / samples),
            "filter/adv_le0_frac": _r(adv_le0), "filter/kl_gt_g_frac": _r(kl_gt),
            "is/weight_mean":
                _r(0.97 - (0.05 if peer_samples else 0) + rng.uniform(-0.02, 0.02)) if has_is else None,
            "is/weight_max": _r(min(2.0, 1.4 + rng.uniform(0, 0.8))) if has_is else None,
            "is/truncated_frac":
                _r(rng.uniform(0.0, 0.04) + (0.02 if peer_samples else 0)) if has_is else None,
            "is/ess": _r(0.93 - (0.08 if peer_samples else 0) + rng.uniform(-0.03, 0.03)) if has_is else None,
            "kl/mean": _r(0.012 + (0.02 if peer_samples else 0) + rng.uniform(0, 0.01)),
            "kl/max": _r(0.15 + rng.uniform(0, 0.25)),
            "mismatch/abs_logp_diff": _r(0.0038 + rng.uniform(0, 0.0012), 5),
            "clip_frac": _r(rng.uniform(0, 0.02)),
            "grad_norm": _r(0.9 - 0.015 * rnd + rng.uniform(-0.15, 0.15)),
            "lr": 2e-5,
            "time/gen_s": _r(gen_s, 3), "time/train_s": _r(train_s, 3), "time/sync_s": _r(sync_s, 3),
            "time/peer_wait_s": _r(wait_s, 3), "time/round_s": _r(round_s, 3),
            "gen/tok_s": _r(tokens / gen_s, 1), "gen/tokens": tokens, "gen/mean_len": _r(mean_len, 1),
            "wire/bytes_per_token_out": _r(3.9 + rng.uniform(-0.1, 0.1), 3) if relay_up else None,
            "wire/bytes_per_token_in": _r(4.1 + rng.uniform(-0.15, 0.15), 3) if g_groups else None,
            "peers/groups_received": g_groups + m_groups, "peers/samples_used": peer_samples,
            "peers/rejected": g_rejected + m_counted, "peers/stale": g_stale,
            "relay/connected": relay_up,
            "relay/latency_ms": _r(38 + rng.uniform(-8, 14), 1) if relay_up else None,
            "relay/replayed": 5 if rnd == 13 else 0,
            "memory/oom_retries": 1 if rnd == 9 else 0, "micro_batch": micro_batch,
            "paused": paused,
            "peers": {},
        }
        if gemma["sent"]:
            rec["peers"]["gemma-node"] = dict(gemma, rejected_by_reason=dict(gemma["rejected_by_reason"]))
        if mallory["last_seen"] is not None:
            rec["peers"]["mallory"] = dict(mallory, rejected_by_reason=dict(mallory["rejected_by_reason"]))
        t += round_s
        rec["time"] = _r(t, 3)
        records.append(rec)
        if not relay_up:
            say(t, "WARN", "relay tcp://192.168.1.20:5555 unreachable, retrying")
        if rnd == 13:
            say(t, "INFO", "relay reconnected; 5 rollouts replayed")
        say(t, "INFO", f"round {rnd}: reward own {reward_own:.3f} acc {correct / OWN_SAMPLES:.3f} "
                       f"peers {peer_samples} samples, dropped {dropped}/{samples}, {round_s:.1f} s")
    records.append({"type": "stop", "time": _r(t + 1.5, 3), "round": ROUNDS, "reason": "steps"})
    say(t + 1.5, "INFO", f"stopped after round {ROUNDS} (steps); checkpoint saved")
    return records, log


def write_run(out_dir: Path = OUT_DIR, seed: int = 1234) -> Path:
    """(Re)write the run directory and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records, log = make_records(seed)
    (out_dir / METRICS_FILE).unlink(missing_ok=True)
    writer = MetricsWriter(out_dir)
    for rec in records:
        writer.write(rec)
    writer.close()
    (out_dir / LOG_FILE).write_text("\n".join(log) + "\n")
    (out_dir / "config.toml").write_text(config_toml(CONFIG))
    return out_dir


if __name__ == "__main__":
    path = write_run()
    print(f"wrote {path}")
