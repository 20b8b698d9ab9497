"""One node: one round after another of generate → reward → share → intake → F-TIS step → sync.

    prompts ─▶ generator ─▶ reward ─▶ publish ─▶ relay ─▶ peers
                  ▲                                        │
                  └── sync ◀── learner (own + peer groups) ◀── intake

The loop is deliberately sequential and deterministic (alone mode): prompts, sampling seeds
and training batches are functions of (seed, round), so a run resumed from a checkpoint
replays the next round bit for bit.
"""
from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import signal
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import checkpoint
from .config import Config, to_toml
from .generate.base import SamplerSettings
from .intake import Intake, PeerBook, PeerGroup
from .metrics import LOG_FILE, MetricsWriter, read_control
from .objective import group_advantages

log = logging.getLogger("ftis_edge.node")


def derive_seed(*parts) -> int:
    """A stable 31-bit seed from any parts (Python's hash() is salted per process)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass
class OwnGroup:
    prompt: object
    prompt_ids: list[int]
    completions: list            # generate.Completion
    rewards: list[float]
    breakdowns: list[dict]
    group_id: str
    group_index: int = 0
    group_size: int = 0


def setup_logging(run_dir: Path, *, console: bool) -> None:
    root = logging.getLogger("ftis_edge")
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    fh = logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if console:
        sh = logging.StreamHandler()
        sh.setFormatter(fmt)
        root.addHandler(sh)


class Node:
    def __init__(self, cfg: Config, *, resume: bool = False, console_log: bool = True):
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.run_dir = cfg.run_path
        self.resume = resume
        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.run_dir, console=console_log)
        self.stop_reason: str | None = None
        self.round = 0
        self.oom_retries = 0

    # --- assembly ---------------------------------------------------------------------
    def build(self) -> None:
        """Load everything (model, task, learner, generator, swarm). Slow parts log timings."""
        from .learner import Learner
        from .models import resolve_model
        from .sync import WeightSync
        from .tasks import get_task, warm_up

        cfg = self.cfg
        threads = cfg.model.threads or os.cpu_count() or 2
        torch.set_num_threads(threads)
        t0 = time.time()
        self.bundle = resolve_model(cfg.model.spec)
        self.bundle.require_supported()     # an unsupported architecture fails here, not in a round
        task_opts = {"reward": cfg.task.reward, "timeout_s": cfg.task.reward_timeout_s,
                     "few_shot": cfg.task.few_shot, "require_think": cfg.task.require_think}
        if cfg.task.path:
            task_opts["path"] = cfg.task.path
        if cfg.task.level:
            task_opts["level"] = list(cfg.task.level)
        self.task = get_task(cfg.task.name, **task_opts)
        warm_up()          # start the grader worker now, not inside the first round
        log.info("model %s (%s, fp %s); task %s", self.bundle.name, self.bundle.arch,
                 self.bundle.fingerprint, cfg.task.name)
        device = None if cfg.model.device == "auto" else cfg.model.device
        self.learner = Learner(
            self.bundle, trainable=cfg.train.trainable, lora_r=cfg.train.lora_r,
            lora_alpha=cfg.train.lora_alpha, lora_dropout=cfg.train.lora_dropout,
            lora_targets=tuple(self.bundle.lora_targets(cfg.train.lora_targets)), lr=cfg.train.lr, grad_clip=cfg.train.grad_clip,
            micro_batch=cfg.train.micro_batch, device=device, seed=cfg.node.seed)
        if cfg.model.backend == "hf":
            from .generate.hf import HFGenerator
            self.generator = HFGenerator(self.learner.model, self.bundle.tokenizer(),
                                         eos_token_ids=self.bundle.eos_token_ids)
        else:
            from .generate.llamacpp import LlamaCppGenerator
            self.generator = LlamaCppGenerator.from_bundle(
                self.bundle, precision=cfg.model.precision, n_threads=threads,
                max_group=max(cfg.task.group_size, 1))
        self.sync = WeightSync.from_bundle(self.learner, self.generator, self.bundle, self.run_dir / "adapter")
        log.info("loaded in %.1f s (backend %s, %s)", time.time() - t0, cfg.model.backend,
                 cfg.train.trainable)
        self.swarm = None
        self.book = PeerBook(quarantine_after=cfg.swarm.quarantine_after)
        self.intake = Intake(task=self.task, swarm=cfg.swarm.name, my_node_id=self.node_id,
                             my_tokenizer_fp=self.bundle.tokenizer_fingerprint,
                             vocab_size=self.bundle.vocab_size, book=self.book,
                             rescore_budget_s=cfg.swarm.rescore_budget_s,
                             max_staleness=cfg.swarm.max_staleness)
        if cfg.mode != "alone":
            from .swarm import ClientKeys, SwarmClient
            keys = None
            if cfg.swarm.client_keys:
                keys = ClientKeys.load(cfg.swarm.client_keys, cfg.swarm.server_key)
            self.swarm = SwarmClient(cfg.swarm.relay, swarm=cfg.swarm.name, node_id=self.node_id, keys=keys)
            self.swarm.start()
            log.info("joined swarm '%s' via %s (%s)", cfg.swarm.name, cfg.swarm.relay, cfg.mode)
        self.metrics = MetricsWriter(self.run_dir)

    # --- state ------------------------------------------------------------------------
    def _restore(self) -> int | None:
        state = checkpoint.load_latest(self.run_dir)
        if state is None:
            log.warning("--resume: no checkpoint in %s, starting fresh", self.run_dir)
            return None
        self.learner.load_state_dict(state["learner"])
        self.round = state["round"]
        self.oom_retries = state.get("oom_retries", 0)
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if state.get("peers"):
            for nid, d in state["peers"].items():
                p = self.book.get(nid)
                for k in ("sent", "accepted", "rejected", "grader_timeouts", "quarantined"):
                    if k in d:
                        setattr(p, k, d[k])
        log.info("resumed from round %d", self.round)
        return self.round

    def _checkpoint(self) -> None:
        t0 = time.time()
        checkpoint.save(self.run_dir, self.round, {
            "round": self.round,
            "learner": self.learner.state_dict(),
            "oom_retries": self.oom_retries,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state()},
            "peers": self.book.snapshot(),
        })
        log.info("checkpoint round %d (%.2f s)", self.round, time.time() - t0)

    # --- one round --------------------------------------------------------------------
    def _round_prompts(self):
        """Prompts of this round: a pure function of (seed, round) — or of (swarm, round)
        in horizontal mode, where every node must work on the same prompts."""
        cfg = self.cfg
        per = cfg.task.prompts_per_round
        seed = derive_seed("swarm", cfg.swarm.name) if cfg.mode == "horizontal" else cfg.node.seed
        stream = self.task.prompts(seed=seed, start=(self.round - 1) * per)
        return [next(stream) for _ in range(per)]

    def _generate(self, prompts) -> tuple[list[OwnGroup], dict]:
        cfg = self.cfg
        horizontal = cfg.mode == "horizontal"
        n = cfg.task.group_size // 2 if horizontal else cfg.task.group_size
        groups, tokens, t0 = [], 0, time.time()
        for i, prompt in enumerate(prompts):
            text = self.bundle.render_prompt(self.task.messages(prompt.question))
            prompt_ids = self.bundle.encode(text)
            sampler = SamplerSettings(temperature=cfg.task.temperature, top_k=cfg.task.top_k,
                                      top_p=cfg.task.top_p, max_new_tokens=cfg.task.max_new_tokens,
                                      seed=derive_seed(cfg.node.seed, self.node_id, self.round, i))
            comps = self.generator.generate(prompt_ids, n, sampler)
            tokens += sum(len(c.token_ids) for c in comps)
            if horizontal:
                group_id = f"{cfg.swarm.name}:{self.round}:{prompt.id}"
            else:
                group_id = f"{self.node_id}:{self.round}:{i}"
            groups.append(OwnGroup(prompt=prompt, prompt_ids=list(prompt_ids), completions=comps,
                                   rewards=[], breakdowns=[], group_id=group_id, group_size=n))
        gen_s = time.time() - t0
        # Grade all own completions in one call.
        texts = [c.text for g in groups for c in g.completions]
        refs = [g.prompt.reference for g in groups for _ in g.completions]
        results = self.task.reward_many(texts, refs)
        k = 0
        for g in groups:
            for _ in g.completions:
                v, b = results[k]
                g.rewards.append(float(v))
                g.breakdowns.append(b)
                k += 1
        lens = [len(c.token_ids) for g in groups for c in g.completions]
        return groups, {"time/gen_s": gen_s, "gen/tokens": tokens,
                        "gen/tok_s": tokens / gen_s if gen_s > 0 else None,
                        "gen/mean_len": statistics.fmean(lens) if lens else None}

    def _publish(self, groups: list[OwnGroup]) -> dict:
        from .wire import Rollout, WireCompletion, encode
        cfg, b = self.cfg, self.bundle
        horizontal = cfg.mode == "horizontal"
        nbytes = ntok = 0
        for g in groups:
            comps = [WireCompletion(token_ids=np.asarray(c.token_ids, dtype=np.int64),
                                    logprobs=np.asarray(c.logprobs, dtype=np.float32),
                                    text=c.text, reward=r, finish_reason=c.finish_reason)
                     for c, r in zip(g.completions, g.rewards)]
            rollout = Rollout(
                rollout_id=uuid.uuid4().hex, node_id=self.node_id, swarm=cfg.swarm.name,
                task=self.task.name, prompt_id=g.prompt.id, prompt_ids=None, group_id=g.group_id,
                group_index=0, group_size=cfg.task.group_size if horizontal else len(comps),
                round=self.round, completions=comps, model_fp=b.fingerprint,
                tokenizer_fp=b.tokenizer_fingerprint, model_name=b.name, vocab_size=b.vocab_size,
                temperature=cfg.task.temperature, top_k=cfg.task.top_k, top_p=cfg.task.top_p,
                adapter_version=self.learner.version, sent_at=time.time())
            data = encode(rollout)
            nbytes += len(data)
            ntok += sum(len(c.token_ids) for c in comps)
            self.swarm.publish(rollout)
        return {"wire/bytes_per_token_out": nbytes / ntok if ntok else None}

    def _collect_peers(self, own_group_ids: set[str] | None) -> tuple[list[PeerGroup], dict]:
        """Wait (bounded) for peer groups; a slow or absent peer never stalls the node."""
        cfg = self.cfg
        t0 = time.time()
        deadline = t0 + cfg.swarm.max_wait_s
        limit = cfg.swarm.max_peer_groups
        nbytes = ntok = 0
        while True:
            items = self.swarm.poll(timeout_s=min(0.2, max(0.0, deadline - time.time())))
            for it in items:
                if it.rollout is not None:
                    nbytes += it.nbytes
                    ntok += it.rollout.num_tokens
            self.intake.receive(items, self.round)
            ready = [g for g in self.intake.buffer
                     if own_group_ids is None or g.rollout.group_id in own_group_ids]
            if len(ready) >= limit or time.time() >= deadline:
                break
        taken = self.intake.take(self.round, limit, own_group_ids)
        counts = self.intake.pop_round_counts()
        return taken, {"time/peer_wait_s": time.time() - t0,
                       "wire/bytes_per_token_in": nbytes / ntok if ntok else None,
                       "peers/groups_received": counts.get("received", 0),
                       "peers/rejected": counts.get("rejected", 0),
                       "peers/stale": counts.get("stale", 0)}

    def _peer_samples(self, g: PeerGroup, advantages: list[float]):
        """TrainSamples for a peer group: token level when the tokenizer matches, else the
        completion text is re-tokenized locally and weighted at sequence level."""
        from .learner import TrainSample
        text = self.bundle.render_prompt(self.task.messages(g.prompt.question))
        prompt_ids = self.bundle.encode(text)
        out = []
        for c, adv in zip(g.rollout.completions, advantages):
            if g.same_tokenizer:
                out.append(TrainSample(prompt_ids=prompt_ids, completion_ids=[int(t) for t in c.token_ids],
                                       gen_logprobs=[float(x) for x in c.logprobs], gen_logprob_sum=None,
                                       advantage=adv, source=g.rollout.node_id))
            else:
                ids = self._retokenize(c.text, finished=c.finish_reason == "stop")
                out.append(TrainSample(prompt_ids=prompt_ids, completion_ids=ids, gen_logprobs=None,
                                       gen_logprob_sum=float(np.sum(c.logprobs)), advantage=adv,
                                       sequence_level=True, source=g.rollout.node_id))
        return out

    def _retokenize(self, text: str, *, finished: bool) -> list[int]:
        """A peer's completion text in our tokenizer (no BOS; our EOS when the peer stopped)."""
        ids = self.bundle.tokenizer()(text, add_special_tokens=False)["input_ids"]
        if finished and self.bundle.eos_token_ids:
            ids = ids + [self.bundle.eos_token_ids[0]]
        return ids[: self.cfg.task.max_new_tokens * 4]

    def _build_batch(self, own: list[OwnGroup], peers: list[PeerGroup]):
        from .learner import TrainSample
        cfg = self.cfg
        scale = cfg.train.advantage_scale
        samples, skipped = [], 0
        self._with_peer_parts = 0
        if cfg.mode == "horizontal":
            # The advantage is over the union of all parts of a group (own + peers').
            by_group: dict[str, list[PeerGroup]] = {}
            for p in peers:
                by_group.setdefault(p.rollout.group_id, []).append(p)
            for g in own:
                parts = by_group.get(g.group_id, [])
                self._with_peer_parts += bool(parts)
                rewards = g.rewards + [r for p in parts for r in p.rewards]
                adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), scale=scale).tolist()
                if max(rewards) == min(rewards):
                    skipped += 1
                    continue
                for c, a in zip(g.completions, adv):
                    samples.append(TrainSample(prompt_ids=g.prompt_ids, completion_ids=list(c.token_ids),
                                               gen_logprobs=list(c.logprobs), gen_logprob_sum=None,
                                               advantage=a, source="own"))
                k = len(g.completions)
                for p in parts:
                    samples += self._peer_samples(p, adv[k:k + len(p.rewards)])
                    k += len(p.rewards)
            return samples, skipped
        for g in own:
            if max(g.rewards) == min(g.rewards):
                skipped += 1
                continue
            adv = group_advantages(torch.tensor(g.rewards, dtype=torch.float32), scale=scale).tolist()
            for c, a in zip(g.completions, adv):
                samples.append(TrainSample(prompt_ids=g.prompt_ids, completion_ids=list(c.token_ids),
                                           gen_logprobs=list(c.logprobs), gen_logprob_sum=None,
                                           advantage=a, source="own"))
        for p in peers:      # vertical: each peer group is normalised within itself
            if max(p.rewards) == min(p.rewards):
                skipped += 1
                continue
            adv = group_advantages(torch.tensor(p.rewards, dtype=torch.float32), scale=scale).tolist()
            samples += self._peer_samples(p, adv)
        return samples, skipped

    def _train(self, samples) -> dict:
        from .learner import LearnerOOM
        cfg = self.cfg
        kw = dict(method=cfg.train.method, C=cfg.train.C, eps=cfg.train.eps,
                  kl_threshold=cfg.train.kl_threshold, normalize=cfg.train.normalize)
        while True:
            try:
                return self.learner.step(samples, **kw)
            except LearnerOOM:
                if self.learner.micro_batch == 1:
                    raise
                self.learner.micro_batch = max(1, self.learner.micro_batch // 2)
                self.oom_retries += 1
                log.warning("out of memory: micro-batch halved to %d, retrying the step",
                            self.learner.micro_batch)

    def _peer_accounting(self, samples, stats) -> None:
        per = stats.get("per_sample") or {}
        if not per:
            return
        kl, w, dropped = per.get("kl"), per.get("is_weight"), per.get("dropped")
        for i, s in enumerate(samples):
            if s.source == "own":
                continue
            p = self.book.get(s.source)
            p.samples_used += 1
            if kl is not None:
                p.kl_sum += float(kl[i])
            if w is not None:
                p.is_weight_sum += float(w[i])
            if dropped is not None and bool(dropped[i]):
                p.filtered += 1

    def run_round(self) -> dict:
        cfg = self.cfg
        t_round = time.time()
        prompts = self._round_prompts()
        own, gen_stats = self._generate(prompts)
        record: dict = {"round": self.round, **gen_stats}
        if self.swarm is not None:
            if cfg.swarm.share:
                record.update(self._publish(own))
            ids = {g.group_id for g in own} if cfg.mode == "horizontal" else None
            peers, peer_stats = self._collect_peers(ids)
            record.update(peer_stats)
        else:
            peers = []
        samples, skipped = self._build_batch(own, peers)
        t0 = time.time()
        stats = self._train(samples) if samples else {"skipped": 1, "samples": 0}
        record["time/train_s"] = time.time() - t0
        self._peer_accounting(samples, stats)
        t0 = time.time()
        sync_info = self.sync.sync(self.learner.version) or {}
        record["time/sync_s"] = time.time() - t0
        own_rewards = [r for g in own for r in g.rewards]
        peer_rewards = [r for p in peers for r in p.rewards]
        record.update({
            "reward/own": statistics.fmean(own_rewards) if own_rewards else None,
            "reward/peers": statistics.fmean(peer_rewards) if peer_rewards else None,
            "reward/mean": statistics.fmean(own_rewards + peer_rewards) if own_rewards else None,
            "accuracy/own": statistics.fmean([float(b.get("correct", False)) for g in own for b in g.breakdowns]),
            "format/own": statistics.fmean([float(b.get("format_ok", False)) for g in own for b in g.breakdowns]),
            "samples/own": sum(1 for s in samples if s.source == "own"),
            "samples/peers": sum(1 for s in samples if s.source != "own"),
            "peers/samples_used": sum(1 for s in samples if s.source != "own"),
            "groups/skipped_equal_reward": skipped,
            "groups/with_peer_parts": self._with_peer_parts if cfg.mode == "horizontal" else None,
            "memory/oom_retries": self.oom_retries, "micro_batch": self.learner.micro_batch,
            "lr": cfg.train.lr,
        })
        record.update({k: v for k, v in sync_info.items() if isinstance(v, (int, float))})
        record.update({k: v for k, v in stats.items() if k != "per_sample"})
        if self.swarm is not None:
            s = self.swarm.stats()
            record.update({"relay/connected": s.get("connected"), "relay/latency_ms": s.get("latency_ms"),
                           "relay/replayed": s.get("replayed")})
        record["peers"] = self.book.snapshot()
        record["time/round_s"] = time.time() - t_round
        return record

    # --- the loop ---------------------------------------------------------------------
    def _wait_if_paused(self) -> bool:
        paused = False
        while True:
            ctl = read_control(self.run_dir)
            if ctl["stop"]:
                self.stop_reason = "user"
                return paused
            if not ctl["pause"] or self.stop_reason:
                return paused
            if not paused:
                log.info("paused (press p in the dashboard to resume)")
            paused = True
            time.sleep(0.25)

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_reason:          # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.stop_reason = "signal"
        log.info("stopping after this round (signal %d); press Ctrl-C again to abort", signum)

    def run(self) -> int:
        cfg = self.cfg
        (self.run_dir / "config.toml").write_text(to_toml(cfg))
        from .metrics import write_control
        write_control(self.run_dir, pause=False, stop=False)
        self.build()
        resumed = self._restore() if self.resume else None
        self.sync.sync(self.learner.version)          # generator starts from the learner's weights
        self.metrics.write({
            "type": "start", "node_id": self.node_id, "model": self.bundle.name,
            "model_fp": self.bundle.fingerprint, "tokenizer_fp": self.bundle.tokenizer_fingerprint,
            "backend": cfg.model.backend, "trainable": cfg.train.trainable, "method": cfg.train.method,
            "collaboration": cfg.mode, "relay": cfg.swarm.relay or None, "resumed_from": resumed,
            "config": cfg.to_dict()})
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while self.round < cfg.node.rounds and not self.stop_reason:
                paused = self._wait_if_paused()
                if self.stop_reason:
                    break
                self.round += 1
                record = self.run_round()
                record["paused"] = paused
                self.metrics.write(record)
                log.info("round %d: reward own %.3f%s, loss %s, dropped %s, %.1f s",
                         self.round, record["reward/own"] or 0.0,
                         f" peers {record['reward/peers']:.3f}" if record.get("reward/peers") is not None else "",
                         _fmt(record.get("loss")), record.get("filter/dropped", 0), record["time/round_s"])
                if self.round % cfg.node.checkpoint_every == 0 or self.round == cfg.node.rounds \
                        or self.stop_reason:
                    self._checkpoint()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.swarm is not None:
                self.swarm.close()
            self.generator.close()
        reason = self.stop_reason or "steps"
        self.metrics.write({"type": "stop", "round": self.round, "reason": reason})
        self.metrics.close()
        log.info("stopped after round %d (%s); run dir %s", self.round, reason, self.run_dir)
        return 0


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.4f}"


def reset_run_dir(run_dir: Path) -> None:
    """Start a fresh run in ``run_dir`` (keeps nothing of a previous run)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
