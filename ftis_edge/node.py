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
import random
import signal
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from . import checkpoint, diskspace, machine, neighbours, preflight, rundir
from . import progress as phases
from .batch import LocalTokenizer, OwnGroup, SampleRules, build_batch, peer_usage
from .samples import OWN
from .compute import ComputeTotals, CpuClock, round_compute
from .plausibility import PlausibilityConfig
from .config import Config
from .errors import FtisError, one_line
from .generate.base import SamplerSettings
from .intake import Intake, PeerBook, PeerGroup, ids_decoder
from .heldout import eval_line
from .logs import quiet_third_party, round_line, setup_logging
from .metrics import MetricsWriter, read_control
from .paths import cache_dir

log = logging.getLogger("ftis_edge.node")

# Ctrl-C, a service manager, a closed terminal or SSH drop: each stops after the round, with a checkpoint
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def derive_seed(*parts) -> int:
    """A stable 31-bit seed from any parts (Python's hash() is salted per process)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF





def own_grading_stats(own: list[OwnGroup]) -> dict:
    """accuracy/format of the own completions, and how many of them scored 0 because grading ran
    out of its budget (task.reward_timeout_s): on an overloaded machine that changes rewards, so
    it is counted and logged, never silent."""
    marks = [b for g in own for b in g.breakdowns]
    timed_out = sum(bool(b.get("timed_out")) for b in marks)
    if timed_out:
        log.warning("%d of %d own answers ran out of the grading budget (task.reward_timeout_s) and "
                    "scored 0: the machine is too busy for the budget", timed_out, len(marks))
    return {"accuracy/own": statistics.fmean([float(b.get("correct", False)) for b in marks]) if marks else None,
            "format/own": statistics.fmean([float(b.get("format_ok", False)) for b in marks]) if marks else None,
            "reward/timed_out": timed_out,
            # answers the rules refused ("a computation, not its result", words around the answer): a
            # count that climbs is the learner searching for a way around the grader
            "reward/refused": sum(str(b.get("reason", "")).startswith("refused") for b in marks)}


def useful_peers(samples, per_sample: dict | None) -> set[str]:
    """Peers with a sample the step trained on with a learning signal: a nonzero advantage
    (a group whose rewards are all equal, e.g. zero-reward junk, teaches nothing), neither
    dropped by the F- filter nor judged implausible (per_sample: the step's per-sample tensors,
    in batch order; none: no step ran)."""
    if not per_sample:
        return set()
    flags = [per_sample[k] for k in ("dropped", "implausible") if per_sample.get(k) is not None]
    adv = per_sample.get("advantage")
    return {s.source for i, s in enumerate(samples)
            if s.source != OWN and not any(bool(f[i]) for f in flags)
            and (float(s.advantage) if adv is None else float(adv[i])) != 0.0}


@dataclass
class WireCount:
    """Rollouts on the wire in one direction this round: their bytes and tokens."""
    nbytes: int = 0
    ntokens: int = 0

    def add(self, nbytes: int, ntokens: int) -> None:
        self.nbytes += nbytes
        self.ntokens += ntokens

    def per_token(self) -> float | None:
        return self.nbytes / self.ntokens if self.ntokens else None


@dataclass
class Filled:
    """A round's batch under batch fill: own groups (the minimum plus any top-up), the peer
    groups that replaced the rest, and what generating and waiting for them took."""
    own: list
    peers: list
    gen_s: float
    tokens: int
    topped_up: int                  # own groups generated because peers did not supply them
    peer_stats: dict = field(default_factory=dict)

class Node:
    def __init__(self, cfg: Config, *, resume: bool = False, fresh_if_missing: bool = False,
                 console_log: bool = True):
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.run_dir = cfg.run_path
        self.resume = resume
        self.fresh_if_missing = fresh_if_missing     # --resume-or-fresh
        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.run_dir, console=console_log)
        self.stop_reason: str | None = None
        self.round = 0
        self.oom_retries = 0
        self.saved_round = 0          # the round of the newest checkpoint (this run's or restored)
        self.metrics = None
        self.progress = phases.ProgressReport(self.run_dir)    # what the dashboard's phase cell reads
        self.totals = ComputeTotals()      # own tokens, CPU-seconds, groups: cumulative, checkpointed
        self.cpu = CpuClock()
        self._bytes_in = WireCount()      # this round's received rollouts

    # --- assembly ---------------------------------------------------------------------
    def build(self) -> None:
        """Load everything (model, task, learner, generator, swarm). Slow parts log timings."""
        from .generate.base import GeneratorOptions
        from .generate.registry import create_generator
        from .learner import Learner
        from .models import resolve_model
        from .sync import WeightSync
        from .tasks import task_from_config, warm_up

        cfg = self.cfg = self._resolve_engines(self.cfg)     # idempotent; run() did it already
        quiet_third_party()
        t0 = time.time()
        load_key = phases.load_key(cfg.model.spec, cfg.model.backend, cfg.train.trainable)
        last_s = phases.last_load_seconds(cache_dir(), load_key)
        self.progress.phase(phases.LOADING, what=f"{cfg.model.spec} ({cfg.model.backend}, {cfg.train.trainable})",
                            last_s=last_s)
        if last_s is not None:
            log.info("loading %s (%.0f s last time)", cfg.model.spec, last_s,
                     extra={"console": False})     # node.log: a bad spec must still fail in one line
        self.bundle = resolve_model(cfg.model.spec)
        self.bundle.require_supported()     # an unsupported architecture fails here, not in a round
        self.task = task_from_config(cfg.task)
        preflight.check(cfg, self.bundle, self.task)   # config vs model, in one line, before loading
        warm_up()          # start the grader worker now, not inside the first round
        threads, crowded = neighbours.threads_for(cfg.model.threads)   # 0: all cores, or a share beside other nodes
        if crowded:
            log.warning("%s", crowded)
        torch.set_num_threads(threads)
        log.info("model %s (%s %s, fp %s); task %s", cfg.model.spec, self.bundle.name, self.bundle.arch,
                 self.bundle.fingerprint, cfg.task.name)
        device = None if cfg.model.device == "auto" else cfg.model.device
        self.learner = Learner(
            self.bundle, trainable=cfg.train.trainable, lora_r=cfg.train.lora_r,
            lora_alpha=cfg.train.lora_alpha, lora_dropout=cfg.train.lora_dropout,
            lora_targets=tuple(self.bundle.lora_targets(cfg.train.lora_targets)),
            lr=cfg.train.lr,
            grad_clip=cfg.train.max_grad_norm, micro_batch=cfg.train.micro_batch, device=device, seed=cfg.node.seed)
        self.generator = create_generator(cfg.model.backend, self.bundle, GeneratorOptions(
            precision=cfg.model.precision, threads=threads, max_group=max(cfg.task.num_generations, 1),
            policy=self.learner.model))
        self.local_tokenizer = self._local_tokenizer()
        self.sample_rules = self._sample_rules()
        self.sync = WeightSync.from_bundle(self.learner, self.generator, self.bundle, self.run_dir / rundir.ADAPTER_DIR)
        log.info("loaded in %.1f s (backend %s, %s)", time.time() - t0, cfg.model.backend,
                 cfg.train.trainable)
        phases.remember_load_seconds(cache_dir(), load_key, time.time() - t0)
        self.learner.on_micro_batch = lambda done, total: self.progress.advance(done, total)
        self.swarm = None
        self.book = PeerBook(quarantine_after=cfg.swarm.quarantine_after,
                             window=cfg.swarm.quarantine_window, max_reject_rate=cfg.swarm.quarantine_rate)
        self.intake = Intake(task=self.task, swarm=cfg.swarm.name, my_node_id=self.node_id,
                             my_tokenizer_fp=self.bundle.tokenizer_fingerprint,
                             vocab_size=self.bundle.vocab_size, book=self.book,
                             decode=ids_decoder(self.bundle.tokenizer()), stop_ids=self.bundle.eos_token_ids,
                             rescore_budget_s=cfg.swarm.rescore_budget_s,
                             max_staleness=cfg.swarm.max_staleness,
                             max_group_completions=cfg.task.num_generations)   # no group larger than ours
        if cfg.mode != "alone":
            from .swarm import ClientKeys, SwarmClient
            keys = None
            if cfg.swarm.client_keys:
                keys = ClientKeys.load(cfg.swarm.client_keys, cfg.swarm.server_key)
            k = cfg.swarm.delivery_budget or max(1, cfg.swarm.max_peer_groups)   # horizontal needs every part
            self.swarm = SwarmClient(cfg.swarm.relay, swarm=cfg.swarm.name, node_id=self.node_id, keys=keys,
                                     budget_k=0 if k < 0 or cfg.mode == "horizontal" else k,
                                     filters={"task": list(self.task.tags)})
            self.swarm.start()
            self._watch_relay()
            # not "joined": the client says (and keeps saying) when the relay is unreachable or refuses us
            log.info("connecting to swarm '%s' via %s (%s)", cfg.swarm.name, cfg.swarm.relay, cfg.mode)
        self.metrics = MetricsWriter(self.run_dir)
        self._build_heldout()
        from .divergence import DivergenceWatch, learning_rate_note
        self.divergence = DivergenceWatch(cfg)
        note = learning_rate_note(cfg)
        if note:
            log.warning("%s", note)

    def _watch_relay(self, every_s: float = 1.0) -> None:
        """The relay's health into progress.json within a second of a change, from a thread: a
        round (and its record) can take minutes, the dashboard's relay cell must not."""
        import threading
        self._relay_watch = stop = threading.Event()

        def watch() -> None:
            while not stop.wait(every_s):
                try:
                    health = self.swarm.health()
                    latency = self.swarm.stats().get("latency_ms")
                except Exception:      # noqa: BLE001 - a closing client; the round record still tells
                    return
                self.progress.relay({"state": health.get("state"), "reason": health.get("reason") or None,
                                     "latency_ms": round(latency) if health.get("state") == "connected"
                                     and isinstance(latency, (int, float)) else None})

        threading.Thread(target=watch, name="relay-watch", daemon=True).start()

    def _build_heldout(self) -> None:
        """The held-out eval (heldout.py) on the loaded generator, and the swarm guard (guard.py)
        for a swarm node; neither exists when eval.every = 0 (an alone node is then unchanged)."""
        from .guard import SwarmGuard
        from .heldout import HeldOut
        cfg = self.cfg
        self.heldout = HeldOut(self.task, self.bundle, self.generator, every=cfg.eval.every,
                               prompts=cfg.eval.prompts, max_new_tokens=cfg.task.max_completion_length)
        self.guard = None
        self._base_record: dict = {}          # the base model's eval, for round 1's record
        if self.swarm is not None and cfg.eval.guard:
            if self.heldout.active:
                self.guard = SwarmGuard(self.bundle.tokenizer_fingerprint, self.bundle.fingerprint,
                                        alpha=cfg.eval.guard_alpha)
            else:
                log.warning("swarm guard off: it acts on held-out evals, and this run has none (eval.every = 0 "
                            "or a task without an eval split)")

    # --- state ------------------------------------------------------------------------
    def _restore(self) -> int | None:
        state = checkpoint.load_latest(self.run_dir)     # verified; falls back to an older one
        if state is None:
            raise checkpoint.CheckpointError(f"--resume: no checkpoint in {checkpoint.dir_of(self.run_dir)}")
        checkpoint.into_learner(self.learner, state["learner"], self.run_dir)
        self.round = self.saved_round = state["round"]
        self.oom_retries = state.get("oom_retries", 0)
        self.totals = ComputeTotals.from_state(state.get("compute"))
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if state.get("peers"):
            for nid, d in state["peers"].items():
                p = self.book.get(nid)
                for k in ("sent", "accepted", "rejected", "grader_timeouts", "quarantined",
                          "quarantine_reason", "last_seen"):
                    if k in d:
                        setattr(p, k, d[k])
        self.heldout.load_state(state.get("heldout"))
        self._note_kept_best()
        if self.guard is not None:
            self.guard.load_state(state.get("guard"))
        log.info("resumed from round %d", self.round)
        return self.round

    def _checkpoint(self) -> None:
        t0 = time.time()
        self.progress.phase(phases.CHECKPOINTING)
        state = {
            "round": self.round,
            "learner": self.learner.state_dict(),
            "oom_retries": self.oom_retries,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state()},
            "peers": self.book.snapshot(),
            "compute": self.totals.state(),
            **({"heldout": self.heldout.state()} if self.heldout.active else {}),
            **({"guard": self.guard.state()} if self.guard is not None else {}),
        }
        self._room_for_checkpoint(diskspace.tensor_bytes(state))
        checkpoint.save(self.run_dir, self.round, state, best=self._best_pointer())
        self.saved_round = self.round
        log.info("checkpoint round %d (%.2f s)", self.round, time.time() - t0)

    def _kept(self) -> str:
        if self.saved_round:
            return f"the checkpoint of round {self.saved_round} is kept"
        return "no checkpoint was written yet" if self.round else "no round is lost: none had run"

    def _room_for_checkpoint(self, need: int) -> None:
        """Room for this checkpoint, made by removing all but the newest older one (it would be
        removed after the write anyway); DiskFull, with the newest kept, when there is none."""
        checkpoint.make_room(self.run_dir, need + diskspace.MARGIN, diskspace.free_bytes)
        diskspace.require(checkpoint.dir_of(self.run_dir), need, f"the checkpoint of round {self.round}",
                          kept=self._kept())

    def _room_at_start(self) -> None:
        """Before round 1: room for a checkpoint and the generator's weights (written every round,
        two kept), so a disk that can never hold them costs no round."""
        state = self.learner.state_dict()
        weights = diskspace.tensor_bytes(state["trainable"])
        # Adam's two moments appear with the first step: a checkpoint holds ~3x the weights
        self._disk_need = max(diskspace.tensor_bytes(state), 3 * weights) + 2 * weights
        diskspace.require(self.run_dir, self._disk_need, "a checkpoint and this model's weights", kept=self._kept())

    def _best_pointer(self) -> dict | None:
        """What a checkpoint's manifest says of the best held-out weights kept beside it."""
        kept = checkpoint.best_info(self.run_dir)
        return {"dir": f"best-{kept['round']:06d}", "round": kept["round"], **(kept.get("best") or {})} \
            if kept else None

    def _note_kept_best(self) -> None:
        """On resume: the best weights on disk may come from an eval after the checkpoint (a round
        now replayed); they are real weights with a real eval, so they stay (export takes them)
        until a later eval beats the checkpoint's best."""
        kept = checkpoint.best_info(self.run_dir)
        best = self.heldout.best
        if kept and best is not None and kept["round"] != best.round:
            log.info("held-out eval: keeping the best weights of round %d on disk (the checkpoint knew round %d)",
                     kept["round"], best.round)

    # --- held-out eval -----------------------------------------------------------------
    def _eval(self, round_: int) -> dict:
        """Score the current weights on the held-out set: the record's eval/* keys; keeps the
        weights when they are the best so far; the swarm guard decides on it."""
        t0 = time.time()
        self.progress.phase(phases.EVALUATING, total=len(self.heldout.prompts))
        result = self.heldout.run(round_)
        rec = self.heldout.record(result)
        if self.heldout.is_best(result):
            lo, hi = result.interval
            checkpoint.save_best(self.run_dir, round_, self.learner.state_dict()["trainable"],
                                 {"accuracy": result.accuracy, "n": result.n, "interval": [lo, hi],
                                  "base_accuracy": self.heldout.base.accuracy,
                                  "trainable": self.cfg.train.trainable})
        if self.guard is not None and round_ > 0:
            step = self.guard.observe(result, self.heldout.best, self.heldout.base, self.book.snapshot())
            rec["swarm/guard"] = step.line
            (log.warning if step.moved or step.harmed else log.info)("swarm guard: %s", step.line)
        rec["time/eval_s"] = time.time() - t0
        return rec

    def _eval_base(self) -> None:
        """Round 0: the base model's held-out accuracy, the reference of every later eval; its keys
        (eval/base_*) go into round 1's record."""
        rec = self._eval(0)
        self._base_record = {**self.heldout.base_record(), "time/eval_s": rec["time/eval_s"]}
        # on record (and screen) now, not only in round 1's record minutes later
        self.metrics.write({"type": "base_eval", "round": 0, **self._base_record})
        b = self.heldout.base
        lo, hi = b.interval
        log.info("held-out eval of the base model: %.0f%% [%.0f–%.0f] on %d %s prompts (%.1f s)",
                 100 * b.accuracy, 100 * lo, 100 * hi, b.n, self.cfg.task.name, rec["time/eval_s"])

    def _admit_peers(self) -> None:
        """The guard's current level: drop buffered peer groups it does not admit (counted)."""
        if self.guard is None or self.guard.level == 0:
            return
        kept = [g for g in self.intake.buffer
                if self.guard.admits(g.rollout.tokenizer_fp, g.rollout.model_fp)]
        self._guard_excluded += len(self.intake.buffer) - len(kept)
        self.intake.buffer = kept

    def _peer_limit(self, limit: int) -> int:
        """Peer groups the round may take: none while the guard has the node training alone."""
        from .guard import ALONE
        return 0 if self.guard is not None and self.guard.level >= ALONE else limit

    # --- one round --------------------------------------------------------------------
    def _round_prompts(self):
        """Prompts of this round: a pure function of (seed, round) — or of (swarm, round)
        in horizontal mode, where every node must work on the same prompts."""
        cfg = self.cfg
        per = cfg.task.prompts_per_round
        seed = derive_seed("swarm", cfg.swarm.name) if cfg.mode == "horizontal" else cfg.node.seed
        stream = self.task.prompts(seed=seed, start=(self.round - 1) * per)
        return [next(stream) for _ in range(per)]

    def _generate(self, prompts, first: int = 0) -> tuple[list[OwnGroup], float, int]:
        """Own groups for ``prompts``, graded: (groups, generation seconds, tokens). ``first`` is
        the index of prompts[0] in the round's prompt list: sampling seeds and group ids are
        functions of (seed, node, round, index), whichever call generates a prompt's group."""
        cfg = self.cfg
        horizontal = cfg.mode == "horizontal"
        n = cfg.task.num_generations // 2 if horizontal else cfg.task.num_generations
        groups, tokens, t0 = [], 0, time.time()
        with self.cpu.measure("gen"):
            self.progress.phase(phases.GENERATING, done=0, total=n * len(prompts))
            for i, prompt in enumerate(prompts, start=first):
                text = self.bundle.render_prompt(self.task.messages(prompt.question))
                prompt_ids = self.bundle.encode(text)
                sampler = SamplerSettings(temperature=cfg.task.temperature, top_k=cfg.task.top_k,
                                          top_p=cfg.task.top_p, max_new_tokens=cfg.task.max_completion_length,
                                          seed=derive_seed(cfg.node.seed, self.node_id, self.round, i))
                comps = self.generator.generate(prompt_ids, n, sampler)
                tokens += sum(len(c.token_ids) for c in comps)
                self.progress.advance(n * (i - first + 1), n * len(prompts),
                                   tok_s=tokens / max(time.time() - t0, 1e-9))
                if horizontal:
                    group_id = f"{cfg.swarm.name}:{self.round}:{prompt.id}"
                else:
                    group_id = f"{self.node_id}:{self.round}:{i}"
                groups.append(OwnGroup(prompt=prompt, prompt_ids=list(prompt_ids), completions=comps,
                                       rewards=[], breakdowns=[], group_id=group_id))
        gen_s = time.time() - t0
        self.progress.phase(phases.GRADING, total=n * len(prompts))
        # Grade all own completions in one call.
        texts = [c.text for g in groups for c in g.completions]
        refs = [g.prompt.reference for g in groups for _ in g.completions]
        with self.cpu.measure("grade"):
            results = self.task.reward_many(texts, refs) if texts else []
        k = 0
        for g in groups:
            for _ in g.completions:
                v, b = results[k]
                g.rewards.append(float(v))
                g.breakdowns.append(b)
                k += 1
        return groups, gen_s, tokens

    @staticmethod
    def _gen_stats(groups: list[OwnGroup], gen_s: float, tokens: int) -> dict:
        lens = [len(c.token_ids) for g in groups for c in g.completions]
        return {"time/gen_s": gen_s, "gen/tokens": tokens,
                "gen/tok_s": tokens / gen_s if gen_s > 0 else None,
                "completions/mean_length": statistics.fmean(lens) if lens else None}

    def _publish(self, groups: list[OwnGroup]) -> tuple[int, int]:
        """Send own groups to the swarm: (bytes, completion tokens) sent."""
        from .wire import Rollout, WireCompletion, encode
        cfg, b = self.cfg, self.bundle
        horizontal = cfg.mode == "horizontal"
        nbytes = ntok = 0
        tb = self._token_bytes()
        for g in groups:
            comps = [WireCompletion(token_ids=np.asarray(c.token_ids, dtype=np.int64),
                                    logprobs=np.asarray(c.logprobs, dtype=np.float32),
                                    text=c.text, reward=r, finish_reason=c.finish_reason,
                                    token_bytes=None if tb is None else tb.lengths(c.token_ids, c.text))
                     for c, r in zip(g.completions, g.rewards)]
            rollout = Rollout(
                rollout_id=uuid.uuid4().hex, node_id=self.node_id, swarm=cfg.swarm.name,
                task=self.task.tag_of(g.prompt.id), prompt_id=g.prompt.id, prompt_ids=None, group_id=g.group_id,
                group_index=0, group_size=cfg.task.num_generations if horizontal else len(comps),
                round=self.round, completions=comps, model_fp=b.fingerprint,
                tokenizer_fp=b.tokenizer_fingerprint, model_name=cfg.model_label, vocab_size=b.vocab_size,
                temperature=cfg.task.temperature, top_k=cfg.task.top_k, top_p=cfg.task.top_p,
                adapter_version=self.learner.version, sent_at=time.time())
            # encoded once, here: the bytes counted are the bytes sent
            data = encode(rollout, codec=self.swarm.codec, limits=self.swarm.limits)
            nbytes += len(data)
            ntok += sum(len(c.token_ids) for c in comps)
            self.swarm.publish_bytes(data, task=rollout.task, tok=rollout.tokenizer_fp)   # tags: filters
        return nbytes, ntok

    def _token_bytes(self):
        """Our tokenizer's per-token bytes (align.TokenBytes), built once; None if unsupported:
        our rollouts then carry no byte lengths and other tokenizers weight them per sequence."""
        if not hasattr(self, "_tb"):
            from .align import AlignError, TokenBytes
            try:
                self._tb = TokenBytes(self.bundle.tokenizer())
            except AlignError as err:
                log.warning("no token byte lengths on the wire (%s): peers with another tokenizer "
                            "will weight our samples per sequence", err)
                self._tb = None
        return self._tb

    def _poll(self, timeout_s: float) -> None:
        """Receive what the relay has for us (waiting at most ``timeout_s``) into intake."""
        with self.cpu.measure("intake"):
            items = self.swarm.poll(timeout_s=timeout_s)
            for it in items:
                if it.rollout is not None:
                    self._bytes_in.add(it.nbytes, it.rollout.num_tokens)
            self.intake.receive(items, self.round)
            self._admit_peers()

    def _collect_peers(self, own_group_ids: set[str] | None, limit: int) -> tuple[list[PeerGroup], dict]:
        """Wait (bounded by swarm.max_wait_s) until ``limit`` peer groups are ready, then take
        them; a slow or absent peer never stalls the node. Vertical: informative groups first,
        at most swarm.max_groups_per_peer of one peer (``Intake.take``)."""
        cfg = self.cfg
        limit = self._peer_limit(limit)
        t0 = time.time()
        deadline = t0 + (cfg.swarm.max_wait_s if limit else 0.0)
        per_peer = cfg.swarm.max_groups_per_peer if own_group_ids is None else None
        self.progress.phase(phases.WAITING, deadline=deadline, done=0, total=limit)
        while True:
            self._poll(min(0.2, max(0.0, deadline - time.time())))
            ready = self.intake.ready(self.round, limit, own_group_ids, per_peer)
            self.progress.advance(min(ready, limit), limit)
            if ready >= limit or time.time() >= deadline:
                break
        with self.cpu.measure("intake"):
            taken = self.intake.take(self.round, limit, own_group_ids, per_peer)
        counts = self.intake.pop_round_counts()
        return taken, {"time/peer_wait_s": time.time() - t0,
                       "wire/bytes_per_token_in": self._bytes_in.per_token(),
                       "peers/groups_received": counts.get("received", 0),
                       "peers/rejected": counts.get("rejected", 0),
                       "peers/stale": counts.get("stale", 0),
                       **{f"peers/{k}": counts.get(k, 0)
                          for k in ("skipped_zero_advantage", "skipped_peer_cap", "skipped_surplus")}}

    def _fill_slots(self) -> int | None:
        """Batch fill (swarm.own_groups > 0, vertical swarm): how many of the round's
        task.prompts_per_round groups peers may supply; None when batch fill is off."""
        cfg = self.cfg
        if self.swarm is None or cfg.mode != "vertical" or not cfg.swarm.own_groups:
            return None
        return max(0, min(cfg.task.prompts_per_round - cfg.swarm.own_groups, cfg.swarm.max_peer_groups))

    def _fill_batch(self, prompts, slots: int, wire_out: WireCount) -> Filled:
        """Batch fill: peers' groups replace part of the own generation, the batch stays B groups.

        1. take in what arrived while we trained (no wait); 2. generate and publish the own
        minimum (the round's first prompts); 3. wait at most swarm.max_wait_s for ``slots``
        fresh informative peer groups; 4. generate the shortfall from the round's next prompts.
        Prompts and seeds are the ones an isolated node uses for the same indices, so a node
        the swarm gives nothing trains on exactly its isolated batch.
        """
        keep = len(prompts) - slots
        self._poll(0.0)
        own, gen_s, tokens = self._generate(prompts[:keep])
        self._share(own, wire_out)
        peers, peer_stats = self._collect_peers(None, slots)
        short = slots - len(peers)
        if short:
            more, more_s, more_tokens = self._generate(prompts[keep:keep + short], first=keep)
            self._share(more, wire_out)
            own, gen_s, tokens = own + more, gen_s + more_s, tokens + more_tokens
        return Filled(own, peers, gen_s, tokens, topped_up=short, peer_stats=peer_stats)

    def _share(self, groups: list[OwnGroup], wire_out: WireCount) -> None:
        if self.cfg.swarm.share and groups:
            with self.cpu.measure("intake"):
                wire_out.add(*self._publish(groups))

    def _local_tokenizer(self) -> LocalTokenizer:
        """How peers' prompts and completion texts become our token ids (for build_batch)."""
        b = self.bundle
        return LocalTokenizer.of_bundle(
            b, lambda prompt: b.encode(b.render_prompt(self.task.messages(prompt.question))),
            max_completion_length=self.cfg.task.max_completion_length,
            token_bytes=self._token_bytes(), cross_tokenizer_level=self.cfg.train.cross_tokenizer_level)

    def _sample_rules(self) -> SampleRules:
        """What this node does with another model's samples and with truncated ones (batch.SampleRules)."""
        t = self.cfg.train
        return SampleRules(model_fp=self.bundle.fingerprint, foreign_length_rule=t.foreign_length_rule,
                           foreign_success_floor=t.foreign_success_floor,
                           mask_truncated_completions=t.mask_truncated_completions)

    def _train(self, samples) -> dict:
        from .learner import LearnerOOM
        cfg = self.cfg
        self.progress.phase(phases.TRAINING, samples=len(samples))
        kw = dict(method=cfg.train.method, C=cfg.train.C, eps=cfg.train.epsilon,
                  kl_threshold=cfg.train.kl_threshold, normalize=cfg.train.normalize,
                  foreign_cap=cfg.train.foreign_is_cap or None,
                  plausible=PlausibilityConfig() if cfg.train.peer_plausibility else None)
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

    def run_round(self) -> dict:
        cfg = self.cfg
        t_round = time.time()
        self.progress.round_started(self.round)
        self.cpu = CpuClock()
        self._bytes_in = WireCount()
        self._guard_excluded = 0
        wire_out = WireCount()
        prompts = self._round_prompts()
        slots = self._fill_slots()
        record: dict = {"round": self.round}
        peers, topped_up = [], 0
        if slots is not None:
            filled = self._fill_batch(prompts, slots, wire_out)
            own, peers, gen_s, tokens, topped_up = filled.own, filled.peers, filled.gen_s, filled.tokens, filled.topped_up
            record.update(filled.peer_stats)
        else:
            own, gen_s, tokens = self._generate(prompts)
            if self.swarm is not None:
                self._share(own, wire_out)
                ids = {g.group_id for g in own} if cfg.mode == "horizontal" else None
                peers, peer_stats = self._collect_peers(ids, cfg.swarm.max_peer_groups)
                record.update(peer_stats)
        record.update(self._gen_stats(own, gen_s, tokens))
        if self.swarm is not None and cfg.swarm.share:
            record["wire/bytes_per_token_out"] = wire_out.per_token()
        record["groups/topped_up"] = topped_up
        batch = build_batch(own, peers, mode=cfg.mode, scale=cfg.train.advantage_scale,
                            local=self.local_tokenizer, rules=self.sample_rules)
        samples = batch.samples
        t0 = time.time()
        with self.cpu.measure("train"):
            stats = self._train(samples) if samples else {"skipped": 1, "samples": 0}
        record["time/train_s"] = time.time() - t0
        uses = peer_usage(samples, stats.get("per_sample"))
        for use in uses:
            self.book.get(use.node_id).record_use(use)
        if self.swarm is not None and stats.get("per_sample"):   # a step ran: the relay's budget
            self.swarm.mark_useful(useful_peers(samples, stats["per_sample"]))   # favours them (Sybil ids)
        t0 = time.time()
        self.progress.phase(phases.SYNCING)
        with self.cpu.measure("sync"):
            sync_info = self.sync.sync(self.learner.version) or {}
        record["time/sync_s"] = time.time() - t0
        own_rewards = [r for g in own for r in g.rewards]
        peer_rewards = [r for p in peers for r in p.rewards]
        record.update({
            "reward/own": statistics.fmean(own_rewards) if own_rewards else None,
            "reward/peers": statistics.fmean(peer_rewards) if peer_rewards else None,
            "reward": statistics.fmean(own_rewards + peer_rewards) if own_rewards else None,
            **own_grading_stats(own),
            "samples/own": batch.own_samples,
            "peers/samples_used": batch.peer_samples,
            "samples/masked_truncated": batch.masked_truncated,
            "peers/refused_length": batch.refused_length,
            "peers/false_tokenizer_claims": batch.false_tokenizer_claims,
            "peers/success_weight": batch.success_weight,
            "frac_reward_zero_std": batch.groups_zero_std / batch.groups if batch.groups else None,
            "groups/with_peer_parts": batch.groups_with_peer_parts,
            "peers/groups_used": len(peers),
            "memory/oom_retries": self.oom_retries, "micro_batch": self.learner.micro_batch,
            "learning_rate": cfg.train.lr,
        })
        record.update({k: v for k, v in sync_info.items() if isinstance(v, (int, float))})
        record.update({k: v for k, v in stats.items() if k != "per_sample"})
        self._watch_divergence(record, samples, stats.get("per_sample"))
        if self.swarm is not None:
            s = self.swarm.stats()
            health = self.swarm.health()
            record.update({"relay/connected": s.get("connected"), "relay/latency_ms": s.get("latency_ms"),
                           "relay/replayed": s.get("replayed"), "relay/state": health["state"],
                           "relay/reason": health.get("reason") or None})
        if self.guard is not None:
            record.update({"swarm/guard_level": self.guard.level, "swarm/guard_excluded": self._guard_excluded})
        record["peers"] = self.book.snapshot()
        record.update(round_compute(self.cpu, self.totals, tokens=tokens, own_groups=len(own),
                                    peer_groups=len(peers), fill=slots is not None))
        record["time/round_s"] = time.time() - t_round
        return record

    def _watch_divergence(self, record: dict, samples, per_sample) -> None:
        """The node's own training collapsing: said in the record (the dashboard shows it) and,
        once per episode, in the log, with the likely cause and the setting to change."""
        from .divergence import own_kl
        kl = own_kl(samples, per_sample)
        record["kl/own_mean"] = kl
        message = self.divergence.observe(record, kl)
        record["train/diverging"] = message
        if self.divergence.is_new(message):
            log.warning("%s", message)

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
                self.progress.phase(phases.PAUSED)
            paused = True
            time.sleep(0.25)

    def _on_signal(self, signum, _frame) -> None:
        # second Ctrl-C (or one after the dashboard's q / Ctrl-C asked for a stop): abort now
        if self.stop_reason or (signum == signal.SIGINT and read_control(self.run_dir)["stop"]):
            raise KeyboardInterrupt
        self.stop_reason = "signal"
        log.info("stopping after this round (%s); press Ctrl-C again to abort", signal.Signals(signum).name)

    def run(self) -> int:
        """Run to the end or a stop request; every stop that completed a round leaves a
        checkpoint of it. A failure is logged (traceback in node.log only), recorded as the
        stop record's reason "error", and re-raised for the CLI to print in one line."""
        try:
            return self._run()
        except BaseException as exc:
            if diskspace.is_disk_full(exc):        # a write still met a full disk: named, in one line
                exc = diskspace.explain(exc, self.run_dir, getattr(self, "_disk_need", None), self._kept())
            self._record_failure(exc)
            raise exc

    @staticmethod
    def _resolve_engines(cfg: Config) -> Config:
        """model.device / model.backend "auto" → what this machine has (said in one line when
        auto picks the HF engine)."""
        from .devices import pick_backend, pick_device
        device = pick_device(cfg.model.device)
        backend, why = pick_backend(cfg.model.backend, device)
        if why:
            log.info("%s", why)
        return replace(cfg, model=replace(cfg.model, device=device, backend=backend))

    def _say_if_left_the_swarm(self) -> None:
        """A resumed run that trained in a swarm and now runs alone says so (before config.toml,
        which holds the run's relay, is rewritten)."""
        from .config import ConfigError, load
        try:
            was = load(self.run_dir / rundir.CONFIG_FILE)
        except ConfigError:
            return
        if was.swarm.relay and self.cfg.mode == "alone":
            log.warning("this run trained in swarm '%s' via %s; resumed ALONE now (add --relay %s to rejoin)",
                        was.swarm.name, was.swarm.relay, was.swarm.relay)

    def _record_failure(self, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            reason, message = "aborted", "aborted (second Ctrl-C); the round in progress is lost"
            log.warning("%s", message, extra={"console": False})
        else:
            reason, message = "error", one_line(exc)
            log.error("failed: %s", message, exc_info=not isinstance(exc, FtisError),
                      extra={"console": False})
        self.progress.phase(phases.STOPPED, reason=reason)
        if self.metrics is not None and getattr(self, "_started", False):
            try:
                self.metrics.write({"type": "stop", "round": self.round, "reason": reason, "error": message})
                self.metrics.close()
            except (OSError, ValueError):
                pass

    def _run(self) -> int:
        cfg = self.cfg = self._resolve_engines(self.cfg)
        if self.resume and not rundir.check_resumable(self.run_dir, fresh_if_missing=self.fresh_if_missing):
            log.warning("--resume-or-fresh: no checkpoint in %s, starting fresh", self.run_dir)
            self.resume = False
        if not self.resume:
            rundir.prepare_fresh(self.run_dir)
        # the resolved config: node.id is the effective id (hostname-model when left empty)
        resolved = replace(cfg, node=replace(cfg.node, id=self.node_id))
        from .metrics import write_control
        write_control(self.run_dir, pause=False, stop=False)
        self.build()
        resumed = self._restore() if self.resume else None
        if self.resume:         # only now that the checkpoint loaded: a failed start changes no record
            self._say_if_left_the_swarm()
            rundir.prepare_resume(self.run_dir)
        rundir.write_record(self.run_dir, resolved)
        self._room_at_start()
        self.sync.sync(self.learner.version)          # generator starts from the learner's weights
        self.metrics.write({
            "type": "start", "node_id": self.node_id, "model": cfg.model_label, "model_name": self.bundle.name,
            "model_fp": self.bundle.fingerprint, "tokenizer_fp": self.bundle.tokenizer_fingerprint,
            "backend": cfg.model.backend, "trainable": cfg.train.trainable, "method": cfg.train.method,
            "collaboration": cfg.mode, "relay": cfg.swarm.relay or None, "resumed_from": resumed,
            "machine": machine.describe(), "config": resolved.to_dict()})
        self._started = True        # from here a failure is part of the run's record
        if self.heldout.active and self.heldout.base is None:
            if resumed is None:
                self._eval_base()
            else:       # the base model is gone: the first eval after the resume is the reference
                log.warning("held-out eval: the checkpoint has no eval of the base model on these prompts "
                            "(eval turned on, or eval.prompts changed, at --resume); later evals compare with "
                            "the first one after round %d", resumed)
        old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            return self._loop(cfg)
        finally:        # only now: a second Ctrl-C while the node shuts down still means "abort now"
            for s, h in old.items():
                signal.signal(s, h)

    def _loop(self, cfg: Config) -> int:
        try:
            while self.round < cfg.node.rounds and not self.stop_reason:
                paused = self._wait_if_paused()
                if self.stop_reason:
                    break
                self.round += 1
                record = self.run_round()
                record["paused"] = paused
                last = self.round == cfg.node.rounds or bool(self.stop_reason) or read_control(self.run_dir)["stop"]
                record.update(self._base_record)
                self._base_record = {}
                if self.heldout.due(self.round, last):
                    record.update(self._eval(self.round))
                self.metrics.write(record)
                line = round_line(record, swarm=self.swarm is not None)
                held = eval_line(record)
                if self.guard is not None and self.guard.level:     # said every round while it holds
                    from .guard import LEVELS
                    held = "; ".join(filter(None, [held, f"swarm guard: {LEVELS[self.guard.level]}"]))
                log.info("%s", f"{line}; {held}" if held else line)
                if self.round % cfg.node.checkpoint_every == 0 or self.round == cfg.node.rounds \
                        or self.stop_reason or read_control(self.run_dir)["stop"]:
                    self._checkpoint()
            if self.round > self.saved_round:      # a stop read between rounds (q while paused)
                self._checkpoint()
        finally:
            if self.swarm is not None:
                self._relay_watch.set()
                self.swarm.close()
            self.generator.close()
        reason = self.stop_reason or "steps"
        self.metrics.write({"type": "stop", "round": self.round, "reason": reason})
        self.metrics.close()
        self.progress.phase(phases.STOPPED, reason=reason)
        log.info("stopped after round %d (%s); run dir %s", self.round, rundir.stop_words(reason), self.run_dir)
        return 0

