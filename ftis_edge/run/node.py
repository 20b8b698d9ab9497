"""One node: its parts assembled, then one round after another (rounds.py), each recorded.

    prompts ─▶ generator ─▶ reward ─▶ publish ─▶ relay ─▶ peers
                  ▲                                        │
                  └── sync ◀── learner (own + peer groups) ◀── intake

This module keeps what outlives a round: assembly (``build``), restore and checkpoint, the
held-out eval schedule and the swarm guard's evals, the loop, stopping, and the run
directory's lock. One round — generate, grade, share, take peers' groups, train, sync — is a
``rounds.Round`` built from the node's parts (``rounds.Parts``, filled once by ``build``;
``swarm_parts.py`` adds a swarm node's relay client and books). The run-long books a checkpoint
keeps are one table, ``Node._books``.

The loop is deliberately sequential and deterministic (alone mode): prompts, sampling seeds
and training batches are functions of (seed, round), so a run resumed from a checkpoint
replays the next round bit for bit.
"""
from __future__ import annotations

import logging
import random
import signal
import threading
import time
from dataclasses import replace

import numpy as np
import torch

from ..store import checkpoint, diskspace, rundir, runlock
from . import machine, neighbours, preflight, swarm_parts
from ..store import progress as phases
from ..metrics.compute import ComputeTotals
from ..config import Config, ConfigError, load
from .devices import resolve_engines
from .divergence import DivergenceWatch, learning_rate_note
from ..errors import FtisError, one_line
from ..generate.base import GeneratorOptions
from ..generate.registry import create_generator
from .guard import LEVELS, SwarmGuard
from .heldout import HeldOut, eval_line
from ..peers.book import PeerBook
from ..peers.intake import Intake, ids_decoder
from ..learn.learner import Learner
from ..learn.precision import slow_note
from .logs import quiet_third_party, round_line, setup_logging
from ..metrics.records import MetricsWriter, read_control, write_control
from ..models.resolve import resolve_model
from ..common.paths import cache_dir
from .rounds import Parts, Round, local_tokenizer_of, sample_rules_of, token_bytes_of
from .sync import WeightSync
from ..tasks import task_from_config, warm_up

log = logging.getLogger("ftis_edge.run.node")

# Ctrl-C, a service manager, a closed terminal or SSH drop: each stops after the round, with a checkpoint
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


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
        self._started = False         # the start record is written: a failure from here is part of the record
        self.round = 0
        self.oom_retries = 0
        self.saved_round = 0          # the round of the newest checkpoint (this run's or restored)
        self.progress = phases.ProgressReport(self.run_dir)    # what the dashboard's phase cell reads
        # what a round runs on (rounds.Parts), filled once by build(); its totals are checkpointed
        self.parts = Parts(cfg=cfg, node_id=self.node_id, progress=self.progress, totals=ComputeTotals())
        self.metrics: MetricsWriter | None = None
        self.heldout: HeldOut | None = None
        self._relay_watch = threading.Event()          # set: the relay-health thread stops
        self._base_record: dict = {}          # the base model's eval, for round 1's record
        self._disk_need: int | None = None    # bytes a checkpoint and the weights need (known after build)

    # --- assembly ---------------------------------------------------------------------
    def build(self) -> None:
        """Load everything (model, task, learner, generator, swarm). Slow parts log timings."""
        cfg = self.cfg = resolve_engines(self.cfg, say=log.info)     # idempotent; run() did it already
        p = self.parts
        p.cfg = cfg
        quiet_third_party()
        t0 = time.time()
        load_key = phases.load_key(cfg.model.spec, cfg.model.backend, cfg.train.trainable)
        last_s = phases.last_load_seconds(cache_dir(), load_key)
        self.progress.phase(phases.LOADING, what=f"{cfg.model.spec} ({cfg.model.backend}, {cfg.train.trainable})",
                            last_s=last_s)
        if last_s is not None:
            log.info("loading %s (%.0f s last time)", cfg.model.spec, last_s,
                     extra={"console": False})     # node.log: a bad spec must still fail in one line
        p.bundle = resolve_model(cfg.model.spec)
        p.bundle.require_supported()     # an unsupported architecture fails here, not in a round
        p.task = task_from_config(cfg.task)
        preflight.check(cfg, p.bundle, p.task)   # config vs model, in one line, before loading
        warm_up()          # start the grader worker now, not inside the first round
        threads, crowded = neighbours.threads_for(cfg.model.threads)   # 0: all cores, or a share beside other nodes
        if crowded:
            log.warning("%s", crowded)
        torch.set_num_threads(threads)
        log.info("model %s (%s %s, fp %s); task %s", cfg.model.spec, p.bundle.name, p.bundle.arch,
                 p.bundle.fingerprint, cfg.task.name)
        device = None if cfg.model.device == "auto" else cfg.model.device
        p.learner = Learner(
            p.bundle, trainable=cfg.train.trainable, lora_r=cfg.train.lora_r,
            lora_alpha=cfg.train.lora_alpha, lora_dropout=cfg.train.lora_dropout,
            lora_targets=tuple(p.bundle.lora_targets(cfg.train.lora_targets)),
            lr=cfg.train.lr,
            grad_clip=cfg.train.max_grad_norm, micro_batch=cfg.train.micro_batch, device=device, seed=cfg.node.seed,
            precision=cfg.train.precision)
        slow = slow_note(p.learner.device.type, cfg.train.precision, machine.cpu_has_bf16())
        if slow:
            log.warning("%s", slow)
        p.generator = create_generator(cfg.model.backend, p.bundle, GeneratorOptions(
            precision=cfg.model.precision, threads=threads, max_group=max(cfg.task.num_generations, 1),
            policy=p.learner.model))
        p.token_bytes = token_bytes_of(p.bundle)
        p.local_tokenizer = local_tokenizer_of(p.bundle, p.task, cfg, p.token_bytes)
        p.sample_rules = sample_rules_of(p.bundle, cfg.train)
        p.sync = WeightSync.from_bundle(p.learner, p.generator, p.bundle, self.run_dir / rundir.ADAPTER_DIR)
        log.info("loaded in %.1f s (backend %s, %s)", time.time() - t0, cfg.model.backend,
                 cfg.train.trainable)
        phases.remember_load_seconds(cache_dir(), load_key, time.time() - t0)
        p.learner.on_micro_batch = lambda done, total: self.progress.advance(done, total)
        p.book = PeerBook(quarantine_after=cfg.swarm.quarantine_after,
                          window=cfg.swarm.quarantine_window, max_reject_rate=cfg.swarm.quarantine_rate)
        p.intake = Intake(task=p.task, swarm=cfg.swarm.name, my_node_id=self.node_id,
                          my_tokenizer_fp=p.bundle.tokenizer_fingerprint,
                          vocab_size=p.bundle.vocab_size, book=p.book,
                          decode=ids_decoder(p.bundle.tokenizer()), stop_ids=p.bundle.eos_token_ids,
                          stop_texts=p.bundle.stop_texts,
                          rescore_budget_s=cfg.swarm.rescore_budget_s,
                          max_staleness=cfg.swarm.max_staleness,
                          max_group_completions=cfg.task.num_generations)   # no group larger than ours
        if cfg.mode != "alone":
            p.swarm = swarm_parts.connect(cfg, self.node_id, p.task.tags)
            swarm_parts.watch_relay(p.swarm, self.progress, self._relay_watch)
            for name, book in swarm_parts.books(cfg, p.task).items():      # worth, kin, outcomes, budget, hints
                setattr(p, name, book)
            trust = swarm_parts.trust_note(cfg)
            if trust:
                log.warning("%s", trust)
            # not "joined": the client says (and keeps saying) when the relay is unreachable or refuses us
            log.info("connecting to swarm '%s' via %s (%s)", cfg.swarm.name, cfg.swarm.relay, cfg.mode)
        self.metrics = MetricsWriter(self.run_dir)
        self._build_heldout()
        p.divergence = DivergenceWatch(cfg)
        note = learning_rate_note(cfg)
        if note:
            log.warning("%s", note)

    def _build_heldout(self) -> None:
        """The held-out eval (heldout.py) on the loaded generator, and the swarm guard (guard.py)
        for a swarm node; neither exists when eval.every = 0 (an alone node is then unchanged)."""
        cfg, p = self.cfg, self.parts
        self.heldout = HeldOut(p.task, p.bundle, p.generator, every=cfg.eval.every,
                               prompts=cfg.eval.prompts, max_new_tokens=cfg.task.max_completion_length)
        if p.swarm is not None and cfg.eval.guard:
            if self.heldout.active:
                p.guard = SwarmGuard(p.bundle.tokenizer_fingerprint, p.bundle.fingerprint, alpha=cfg.eval.guard_alpha,
                                     fills=cfg.mode == "vertical" and bool(cfg.swarm.own_groups))
            else:
                log.warning("swarm guard off: it acts on held-out evals, and this run has none (eval.every = 0 "
                            "or a task without an eval split)")

    # --- state ------------------------------------------------------------------------
    def _restore(self) -> int | None:
        state = checkpoint.load_latest(self.run_dir)     # verified; falls back to an older one
        if state is None:
            raise checkpoint.CheckpointError(f"--resume: no checkpoint in {checkpoint.dir_of(self.run_dir)}")
        checkpoint.into_learner(self.parts.learner, state["learner"], self.run_dir)
        self.round = self.saved_round = state["round"]
        self.oom_retries = state.get("oom_retries", 0)
        self.parts.totals = ComputeTotals.from_state(state.get("compute"))
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if state.get("peers"):
            for nid, d in state["peers"].items():
                peer = self.parts.book.get(nid)
                for k in ("sent", "accepted", "rejected", "grader_timeouts", "quarantined",
                          "quarantine_reason", "last_seen"):
                    if k in d:
                        setattr(peer, k, d[k])
                peer.restore_use(d)
        self.heldout.load_state(state.get("heldout"))
        self._note_kept_best()
        self._restore_books(state)
        log.info("resumed from round %d", self.round)
        return self.round

    def _books(self) -> dict:
        """The run-long books a checkpoint keeps, by their key in it: written and restored from this
        one table (a new book: its line here and its construction in build)."""
        p = self.parts
        books = {"guard": p.guard, "worth": p.worth, "kin": p.kin, "outcomes": p.outcomes, "budget": p.budget,
                 "direction": p.direction, "hints": p.hints}
        return {key: book for key, book in books.items() if book is not None}

    def _restore_books(self, state: dict) -> None:
        """The books (issue 48), so that a resumed node gates, fills and picks prompts as the
        uninterrupted one would. A book that does not read starts empty: its evidence is rebuilt
        within its window, costing own generation, never samples."""
        for key, book in self._books().items():
            try:
                dropped = book.load_state(state.get(key))
            except ValueError as e:
                log.warning("%s; starting it empty", e)
                continue
            if dropped:         # the outcome book: prompts the task no longer knows
                log.warning("outcome book: %d prompts the task no longer knows were dropped", dropped)

    def _checkpoint(self) -> None:
        t0 = time.time()
        self.progress.phase(phases.CHECKPOINTING)
        state = {
            "round": self.round,
            "learner": self.parts.learner.state_dict(),
            "oom_retries": self.oom_retries,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state()},
            "peers": self.parts.book.snapshot(),
            "compute": self.parts.totals.state(),
            **({"heldout": self.heldout.state()} if self.heldout.active else {}),
            **{key: book.state() for key, book in self._books().items()},
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
        state = self.parts.learner.state_dict()
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
            checkpoint.save_best(self.run_dir, round_, self.parts.learner.state_dict()["trainable"],
                                 {"accuracy": result.accuracy, "n": result.n, "interval": [lo, hi],
                                  "base_accuracy": self.heldout.base.accuracy,
                                  "trainable": self.cfg.train.trainable})
        if self.parts.guard is not None and round_ > 0:
            step = self.parts.guard.observe(result, self.heldout.best, self.heldout.base, self.parts.book.snapshot())
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

    # --- one round --------------------------------------------------------------------
    def new_round(self) -> Round:
        """Round ``self.round`` on this node's parts; its own counters start at zero."""
        return Round(self.parts, self.round, oom_retries=self.oom_retries)

    def run_round(self) -> dict:
        """Build round ``self.round`` and run it: its record (the eval keys come in ``_record``)."""
        rnd = self.new_round()
        record = rnd.run()
        self.oom_retries = rnd.oom_retries
        return record

    def _record(self, record: dict, paused: bool) -> None:
        """A finished round: the held-out eval when due, its record and round line, a checkpoint when due."""
        cfg = self.cfg
        record["paused"] = paused
        last = self.round == cfg.node.rounds or bool(self.stop_reason) or read_control(self.run_dir)["stop"]
        record.update(self._base_record)
        self._base_record = {}
        if self.heldout.due(self.round, last):
            record.update(self._eval(self.round))
        self.metrics.write(record)
        line = round_line(record, swarm=self.parts.swarm is not None)
        held = eval_line(record)
        if self.parts.guard is not None and self.parts.guard.level:     # said every round while it holds
            held = "; ".join(filter(None, [held, f"swarm guard: {LEVELS[self.parts.guard.level]}"]))
        log.info("%s", f"{line}; {held}" if held else line)
        if self.round % cfg.node.checkpoint_every == 0 or self.round == cfg.node.rounds \
                or self.stop_reason or read_control(self.run_dir)["stop"]:
            self._checkpoint()

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
        stop record's reason "error", and re-raised for the CLI to print in one line.

        Whoever runs the node holds the run directory's lock (runlock.py) while it runs: RunLocked,
        before anything is written, when a live node has it; kept when this process holds it already."""
        took = runlock.acquire(self.run_dir, rundir.command_name())
        try:
            return self._run()
        except BaseException as exc:
            if diskspace.is_disk_full(exc):        # a write still met a full disk: named, in one line
                exc = diskspace.explain(exc, self.run_dir, self._disk_need, self._kept())
            self._record_failure(exc)
            raise exc
        finally:
            if took:
                runlock.release(self.run_dir)

    def _say_if_left_the_swarm(self) -> None:
        """A resumed run that trained in a swarm and now runs alone says so (before config.toml,
        which holds the run's relay, is rewritten)."""
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
        if self.metrics is not None and self._started:
            try:
                self.metrics.write({"type": "stop", "round": self.round, "reason": reason, "error": message})
                self.metrics.close()
            except (OSError, ValueError):
                pass

    def _run(self) -> int:
        cfg = self.cfg = resolve_engines(self.cfg, say=log.info)
        if self.resume and not rundir.check_resumable(self.run_dir, fresh_if_missing=self.fresh_if_missing):
            log.warning("--resume-or-fresh: no checkpoint in %s, starting fresh", self.run_dir)
            self.resume = False
        if not self.resume:
            rundir.prepare_fresh(self.run_dir)
        # the resolved config: node.id is the effective id (hostname-model when left empty)
        resolved = replace(cfg, node=replace(cfg.node, id=self.node_id))
        write_control(self.run_dir, pause=False, stop=False)
        self.build()
        resumed = self._restore() if self.resume else None
        if self.resume:         # only now that the checkpoint loaded: a failed start changes no record
            self._say_if_left_the_swarm()
            rundir.prepare_resume(self.run_dir)
        rundir.write_record(self.run_dir, resolved)
        self._room_at_start()
        self.parts.sync.sync(self.parts.learner.version)          # generator starts from the learner's weights
        self.metrics.write({
            "type": "start", "node_id": self.node_id, "model": cfg.model_label, "model_name": self.parts.bundle.name,
            "model_fp": self.parts.bundle.fingerprint, "tokenizer_fp": self.parts.bundle.tokenizer_fingerprint,
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
        from ..store.record_watch import RecordWatch
        edits = RecordWatch(self.run_dir, rundir.command_name())   # RUN/config.toml edited: said, not applied
        try:
            while self.round < cfg.node.rounds and not self.stop_reason:
                paused = self._wait_if_paused()
                if self.stop_reason:
                    break
                self.round += 1
                self._record(self.run_round(), paused)
                news = edits.news()
                if news:
                    log.warning("%s", news)
            if self.round > self.saved_round:      # a stop read between rounds (q while paused)
                self._checkpoint()
        finally:
            if self.parts.swarm is not None:
                self._relay_watch.set()
                self.parts.swarm.close()
            self.parts.generator.close()
        reason = self.stop_reason or "steps"
        self.metrics.write({"type": "stop", "round": self.round, "reason": reason})
        self.metrics.close()
        self.progress.phase(phases.STOPPED, reason=reason)
        log.info("stopped after round %d (%s); run dir %s", self.round, rundir.stop_words(reason), self.run_dir)
        return 0

