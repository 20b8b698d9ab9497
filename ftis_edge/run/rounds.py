"""One round of a node, as an object: generate → grade → share → intake → F-TIS step → sync → record.

    prompts ─▶ generator ─▶ reward ─▶ publish ─▶ relay ─▶ peers
                  ▲                                        │
                  └── sync ◀── learner (own + peer groups) ◀── intake ◀── the round's gates

A ``Round`` is built from the node's loaded parts (``Parts``, filled once by ``Node.build``) and
the round number; it owns its counters (CPU clock, wire bytes, groups each gate kept out), so
nothing is reset by hand between rounds. What outlives a round (compute totals, OOM retries, the
peer book, the guard's level, the worth / kin / outcome books) belongs to the node and comes in
through the parts. Prompts, sampling seeds and group ids are functions of (seed, node, round,
index): an alone run and its resume replay bit for bit.

Which peer groups may fill the batch is decided by the round's gates, a list (``Round.gates``:
the guard's level, another tokenizer's text, worth, kin), applied to intake's buffer in one
place (``Round.admit``); intake's order (informative groups first, spread over peers) then picks.
A per-peer policy is a new gate. (The ``PeerPick`` seam that stood here was dropped: the
policies that came, worth and kin, are gates.)
"""
from __future__ import annotations

import hashlib
import logging
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..store import progress as phases
from ..rollout.align import AlignError, TokenBytes
from ..learn.batch import (LocalTokenizer, OwnGroup, SampleRules, build_batch, group_weights, learner_factors,
                           peer_usage)
from ..learn.foreign_budget import ForeignBudget
from ..learn.foreign_direction import ForeignDirection
from ..metrics.compute import ComputeTotals, CpuClock, round_compute
from ..config import Config
from .divergence import DivergenceWatch, own_kl
from ..generate.base import SamplerSettings
from .guard import ALONE
from ..peers.intake import PeerGroup
from ..learn.learner import LearnerOOM
from ..peers.outcomes import OutcomeBook
from ..peers.hints import HintBook, open_turn
from ..peers.kin import MAX_MEASURED, KinBook
from ..peers.plausibility import FOREIGN_SAMPLE_WEIGHT, PlausibilityConfig
from ..rollout.samples import OWN, carries_signal
from ..rollout.wire import Rollout, WireCompletion, encode
from ..peers.worth import KINDS, WorthBook, describe, peer_kind

log = logging.getLogger(__name__)


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


def gen_stats(groups: list[OwnGroup], gen_s: float, tokens: int) -> dict:
    lens = [len(c.token_ids) for g in groups for c in g.completions]
    return {"time/gen_s": gen_s, "gen/tokens": tokens,
            "gen/tok_s": tokens / gen_s if gen_s > 0 else None,
            "completions/mean_length": statistics.fmean(lens) if lens else None}


def token_bytes_of(bundle) -> TokenBytes | None:
    """Our tokenizer's per-token bytes (align.TokenBytes); None if unsupported: our rollouts then
    carry no byte lengths and other tokenizers weight them per sequence."""
    try:
        return TokenBytes(bundle.tokenizer())
    except AlignError as err:
        log.warning("no token byte lengths on the wire (%s): peers with another tokenizer "
                    "will weight our samples per sequence", err)
        return None


def local_tokenizer_of(bundle, task, cfg: Config, token_bytes: TokenBytes | None) -> LocalTokenizer:
    """How peers' prompts and completion texts become our token ids (for build_batch)."""
    return LocalTokenizer.of_bundle(
        bundle, lambda prompt: bundle.encode(bundle.render_prompt(task.messages(prompt.question))),
        max_completion_length=cfg.task.max_completion_length,
        token_bytes=token_bytes, cross_tokenizer_level=cfg.train.cross_tokenizer_level)


def sample_rules_of(bundle, train) -> SampleRules:
    """What this node does with another model's samples and with truncated ones (``train``: the
    config's [train] section)."""
    return SampleRules(model_fp=bundle.fingerprint, foreign_length_rule=train.foreign_length_rule,
                       foreign_success_floor=train.foreign_success_floor,
                       mask_truncated_completions=train.mask_truncated_completions,
                       other_tokenizer=train.other_tokenizer,
                       other_tokenizer_peers=frozenset(train.other_tokenizer_peers))


def fill_slots(cfg: Config, swarm, kin: KinBook | None = None) -> int | None:
    """Batch fill (swarm.own_groups > 0, vertical swarm): how many of the round's
    task.prompts_per_round groups peers may supply; None when batch fill is off. With
    swarm.fill = "kin" (``kin``), no more than its kin allow (kin.KinBook.slots: none without kin)."""
    if swarm is None or cfg.mode != "vertical" or not cfg.swarm.own_groups:
        return None
    slots = max(0, min(cfg.task.prompts_per_round - cfg.swarm.own_groups, cfg.swarm.max_peer_groups))
    return min(slots, kin.slots(cfg.task.prompts_per_round)) if kin is not None else slots


def other_tokenizer_bound(cfg: Config) -> float:
    """What one sample of another tokenizer can weigh in this node's step: 0 when such text is
    not trained (train.other_tokenizer), the learner's bound under train.peer_plausibility, else 1."""
    if not cfg.train.other_tokenizer:
        return 0.0
    return FOREIGN_SAMPLE_WEIGHT if cfg.train.peer_plausibility else 1.0


def direction_bound(cfg: Config) -> ForeignDirection:
    """The direction bound on another tokenizer's text, told how many peers it can tell apart:
    the named ones, where a CURVE relay binds each id to a key; on an open relay ids are claims."""
    t = cfg.train
    keyed = len(set(t.other_tokenizer_peers)) if cfg.swarm.server_key else 0
    return ForeignDirection(distinct_peers=keyed)


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


# a gate's verdict on one buffered peer group (Round.gates)
KEEP, MEASURE, DROP = "keep", "measure", "drop"
GATES = ("guard", "other_tokenizer", "worth", "kin")     # in the order a round applies them


@dataclass
class Parts:
    """What a round runs on: the node's loaded parts (Node.build fills them, once) and its run-long
    state (compute totals; the OOM retry count lives on the node and in checkpoints)."""
    cfg: Config
    node_id: str
    progress: object                # progress.ProgressReport
    totals: ComputeTotals
    bundle: object = None           # models.ModelBundle: prompts rendered and encoded, fingerprints
    task: object = None
    generator: object = None
    learner: object = None
    sync: object = None             # sync.WeightSync
    intake: object = None
    book: object = None             # peers.book.PeerBook
    divergence: DivergenceWatch | None = None
    local_tokenizer: LocalTokenizer | None = None
    sample_rules: SampleRules | None = None
    swarm: object | None = None     # swarm.SwarmClient; None alone
    guard: object | None = None     # guard.SwarmGuard; None without held-out evals or alone
    token_bytes: TokenBytes | None = None
    worth: WorthBook | None = None          # swarm.fill_by_worth: which kinds of peer may fill (run-long)
    outcomes: OutcomeBook | None = None     # swarm.prompt_choice = "outcomes": peers' outcomes (run-long)
    kin: KinBook | None = None              # swarm.fill = "kin": which peers may fill own slots (run-long)
    budget: ForeignBudget | None = None     # train.other_tokenizer + foreign_budget: what such text moves (run-long)
    direction: ForeignDirection | None = None   # ... and how far it moves the weights in any one direction
    hints: HintBook | None = None           # swarm.hints: peers' right answers, cut to hints (run-long)


class Round:
    """Round ``number`` of a node: ``run()`` trains one step and returns the round's record."""

    def __init__(self, parts: Parts, number: int, *, oom_retries: int = 0):
        self.parts = parts
        self.cfg = parts.cfg
        self.number = number
        self.oom_retries = oom_retries      # the run's count so far; the node reads it back after run()
        self.cpu = CpuClock()
        self.wire_in = WireCount()          # received rollouts
        self.wire_out = WireCount()         # published rollouts
        self.excluded = dict.fromkeys(GATES, 0)     # peer groups each gate kept out (Round.gates)
        self.seen: list[tuple[str, list, str]] = []     # (kind, rewards, peer id) of each peer group taken in
        self.to_measure: list[PeerGroup] = []   # groups of unmeasured peers: measured, not trained
        self.measured_groups = 0
        self.kin_now: tuple | None = None   # (kin peers, kin metrics) when the round decided its fill
        self.kind_of: dict[str, str] = {}           # peer node id -> the kind of its newest group
        self.choice = None                          # outcomes.Choice of this round's prompts

    # --- the round ------------------------------------------------------------------------
    def run(self) -> dict:
        p, cfg = self.parts, self.cfg
        t_round = time.time()
        p.progress.round_started(self.number)
        if p.outcomes is not None and p.swarm is not None:
            self.poll(0.0)                  # what arrived while we trained informs the prompts
        prompts = self.prompts()
        # the guard's first rung: generate every group here (peers' groups only on top)
        slots = None if p.guard is not None and p.guard.generates_all else fill_slots(cfg, p.swarm, p.kin)
        self.kin_now = None if p.kin is None else (len(p.kin.kin()), p.kin.metrics())   # this round's kin
        record: dict = {"round": self.number}
        peers, topped_up = [], 0
        if slots is not None:
            filled = self.fill_batch(prompts, slots)
            own, peers, gen_s, tokens, topped_up = filled.own, filled.peers, filled.gen_s, filled.tokens, filled.topped_up
            record.update(filled.peer_stats)
        else:
            own, gen_s, tokens = self.generate(prompts)
            if p.swarm is not None:
                self.share(own)
                ids = {g.group_id for g in own} if cfg.mode == "horizontal" else None
                peers, peer_stats = self.collect_peers(ids, cfg.swarm.max_peer_groups)
                record.update(peer_stats)
        trained_own = own               # what the step trains: hinted groups in place (swarm.hints)
        if p.hints is not None:
            trained_own, hinted, hint_s, hint_tokens = self.hinted(own)
            gen_s, tokens = gen_s + hint_s, tokens + hint_tokens
            record.update(hinted)
        record.update(gen_stats(own, gen_s, tokens))
        if p.swarm is not None and cfg.swarm.share:
            record["wire/bytes_per_token_out"] = self.wire_out.per_token()
        record["groups/topped_up"] = topped_up
        batch = build_batch(trained_own, peers, mode=cfg.mode, scale=cfg.train.advantage_scale,
                            local=p.local_tokenizer, rules=p.sample_rules)
        samples = self.bounded(batch.samples)
        t0 = time.time()
        with self.cpu.measure("train"):
            measured = self.measure(self.take_measured(slots))    # before the step: the weights it starts from
            stats = self.train(samples) if samples else {"skipped": 1, "samples": 0}
        record["time/train_s"] = time.time() - t0
        uses = peer_usage(samples, stats.get("per_sample"), self.plausible())
        for use in uses:
            p.book.get(use.node_id).record_use(use)
        self.weigh(own, uses + measured)
        if p.swarm is not None and stats.get("per_sample"):   # a step ran: the relay's budget
            p.swarm.mark_useful(useful_peers(samples, stats["per_sample"]))   # favours them (Sybil ids)
        saved = sum(group_weights(batch, uses, len(peers))) if slots is not None else None
        t0 = time.time()
        p.progress.phase(phases.SYNCING)
        with self.cpu.measure("sync"):
            sync_info = p.sync.sync(p.learner.version) or {}
        record["time/sync_s"] = time.time() - t0
        own_rewards = [r for g in own for r in g.rewards]
        peer_rewards = [r for g in peers for r in g.rewards]
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
            "peers/refused_untokenizable": batch.refused_untokenizable,
            "peers/skipped_other_tokenizer": self.excluded["other_tokenizer"] + batch.skipped_other_tokenizer,
            "peers/success_weight": batch.success_weight,
            "frac_reward_zero_std": batch.groups_zero_std / batch.groups if batch.groups else None,
            "groups/with_peer_parts": batch.groups_with_peer_parts,
            "peers/groups_used": len(peers),
            "memory/oom_retries": self.oom_retries, "micro_batch": p.learner.micro_batch,
            "learning_rate": cfg.train.lr,
        })
        record.update({k: v for k, v in sync_info.items() if isinstance(v, (int, float))})
        record.update({k: v for k, v in stats.items() if k != "per_sample"})
        self.watch_divergence(record, samples, stats.get("per_sample"))
        if p.swarm is not None:
            s = p.swarm.stats()
            health = p.swarm.health()
            record.update({"relay/connected": s.get("connected"), "relay/latency_ms": s.get("latency_ms"),
                           "relay/replayed": s.get("replayed"), "relay/state": health["state"],
                           "relay/reason": health.get("reason") or None})
        if p.guard is not None:
            record.update({"swarm/guard_level": p.guard.level, "swarm/guard_excluded": self.excluded["guard"]})
        record.update(self.exchange_record(own))
        record["peers"] = p.book.snapshot()
        record.update(round_compute(self.cpu, p.totals, tokens=tokens, own_groups=len(own),
                                    peer_groups=len(peers), fill=slots is not None, saved=saved))
        record["time/round_s"] = time.time() - t_round
        return record

    # --- own groups -----------------------------------------------------------------------
    def prompts(self) -> list:
        """Prompts of this round: a pure function of (seed, round) — or of (swarm, round)
        in horizontal mode, where every node must work on the same prompts."""
        cfg = self.cfg
        per = cfg.task.prompts_per_round
        seed = derive_seed("swarm", cfg.swarm.name) if cfg.mode == "horizontal" else cfg.node.seed
        stream = self.parts.task.prompts(seed=seed, start=(self.number - 1) * per)
        prompts = [next(stream) for _ in range(per)]
        if self.parts.outcomes is None:
            return prompts
        # peers' outcomes put the prompts likeliest to carry signal first: under batch fill the
        # node generates the first ones itself
        self.choice = self.parts.outcomes.choose(self.number, prompts, cfg.task.num_generations)
        return self.choice.prompts

    def generate(self, prompts, first: int = 0) -> tuple[list[OwnGroup], float, int]:
        """Own groups for ``prompts``, graded: (groups, generation seconds, tokens). ``first`` is
        the index of prompts[0] in the round's prompt list: sampling seeds and group ids are
        functions of (seed, node, round, index), whichever call generates a prompt's group."""
        p, cfg = self.parts, self.cfg
        horizontal = cfg.mode == "horizontal"
        n = cfg.task.num_generations // 2 if horizontal else cfg.task.num_generations
        groups, tokens, t0 = [], 0, time.time()
        with self.cpu.measure("gen"):
            p.progress.phase(phases.GENERATING, done=0, total=n * len(prompts))
            for i, prompt in enumerate(prompts, start=first):
                text = p.bundle.render_prompt(p.task.messages(prompt.question))
                prompt_ids = p.bundle.encode(text)
                sampler = SamplerSettings(temperature=cfg.task.temperature, top_k=cfg.task.top_k,
                                          top_p=cfg.task.top_p, max_new_tokens=cfg.task.max_completion_length,
                                          seed=derive_seed(cfg.node.seed, p.node_id, self.number, i))
                comps = p.generator.generate(prompt_ids, n, sampler)
                tokens += sum(len(c.token_ids) for c in comps)
                p.progress.advance(n * (i - first + 1), n * len(prompts),
                                   tok_s=tokens / max(time.time() - t0, 1e-9))
                if horizontal:
                    group_id = f"{cfg.swarm.name}:{self.number}:{prompt.id}"
                else:
                    group_id = f"{p.node_id}:{self.number}:{i}"
                groups.append(OwnGroup(prompt=prompt, prompt_ids=list(prompt_ids), completions=comps,
                                       rewards=[], breakdowns=[], group_id=group_id))
        gen_s = time.time() - t0
        p.progress.phase(phases.GRADING, total=n * len(prompts))
        # Grade all own completions in one call.
        texts = [c.text for g in groups for c in g.completions]
        refs = [g.prompt.reference for g in groups for _ in g.completions]
        with self.cpu.measure("grade"):
            results = p.task.reward_many(texts, refs) if texts else []
        k = 0
        for g in groups:
            for _ in g.completions:
                v, b = results[k]
                g.rewards.append(float(v))
                g.breakdowns.append(b)
                k += 1
        return groups, gen_s, tokens

    def hinted(self, own: list[OwnGroup]) -> tuple[list[OwnGroup], dict, float, int]:
        """swarm.hints (issue 66): an own group with no right answer whose prompt has a peer's hint
        gets a second group, generated with the hint opening the turn (already published: the
        hinted group never is), graded on hint + completion; it replaces the unhinted group in the
        step when it carries signal. The node trains its own tokens with their own log-probs in the
        hinted context. Rewards, books and records keep the unhinted group (what the node does
        alone); seconds and tokens count both. Returns (groups to train, record, seconds, tokens)."""
        p, cfg = self.parts, self.cfg
        tries, tokens, t0 = [], 0, time.time()          # (index in own, hint, prompt ids, completions)
        for i, g in enumerate(own):
            hint = p.hints.for_group(g.prompt, g.rewards)
            if hint is None:
                continue
            rendered = p.bundle.render_prompt(p.task.messages(g.prompt.question))
            prompt_ids = p.bundle.encode(open_turn(rendered, hint.text))
            sampler = SamplerSettings(temperature=cfg.task.temperature, top_k=cfg.task.top_k, top_p=cfg.task.top_p,
                                      max_new_tokens=cfg.task.max_completion_length,
                                      seed=derive_seed(cfg.node.seed, p.node_id, self.number, i, "hint"))
            with self.cpu.measure("gen"):
                comps = p.generator.generate(prompt_ids, cfg.task.num_generations, sampler)
            tokens += sum(len(c.token_ids) for c in comps)
            tries.append((i, hint, prompt_ids, comps))
        # grade every hinted completion in one call, as generate() grades the own ones
        texts = [hint.text + c.text for _, hint, _, comps in tries for c in comps]
        refs = [own[i].prompt.reference for i, _, _, comps in tries for _ in comps]
        with self.cpu.measure("grade"):
            graded = p.task.reward_many(texts, refs) if texts else []
        out, used, hint_rewards, k = list(own), 0, [], 0
        for i, _, prompt_ids, comps in tries:
            part, k = graded[k:k + len(comps)], k + len(comps)
            rewards = [float(v) for v, _ in part]
            hint_rewards += rewards
            if carries_signal(rewards):
                used += 1
                out[i] = OwnGroup(prompt=own[i].prompt, prompt_ids=list(prompt_ids), completions=comps, rewards=rewards,
                                  breakdowns=[b for _, b in part], group_id=f"{own[i].group_id}:hint")
        record = {"hints/tried": len(tries), "hints/used": used, "hints/tokens": tokens, "hints/known": len(p.hints),
                  "hints/reward": statistics.fmean(hint_rewards) if hint_rewards else None}
        return out, record, (time.time() - t0) if tries else 0.0, tokens

    def train(self, samples) -> dict:
        """One F-TIS step; out of memory halves the micro-batch and retries (counted)."""
        p, t = self.parts, self.cfg.train
        p.progress.phase(phases.TRAINING, samples=len(samples))
        kw = dict(self.objective_kwargs(), plausible=self.plausible())
        if t.bounds_other_tokenizer:
            if p.direction is None:
                p.direction = direction_bound(self.cfg)
            kw["apart"] = p.direction
        while True:
            try:
                return p.learner.step(samples, **kw)
            except LearnerOOM:
                if p.learner.micro_batch == 1:
                    raise
                p.learner.micro_batch = max(1, p.learner.micro_batch // 2)
                self.oom_retries += 1
                log.warning("out of memory: micro-batch halved to %d, retrying the step", p.learner.micro_batch)

    def objective_kwargs(self) -> dict:
        t = self.cfg.train
        # another tokenizer's text trained under the budget: its IS weight capped at 1 (no judge checks it)
        cap = t.foreign_is_cap or (1.0 if t.bounds_other_tokenizer else None)
        return dict(method=t.method, C=t.C, eps=t.epsilon, kl_threshold=t.kl_threshold, normalize=t.normalize,
                    foreign_cap=cap)

    def bounded(self, samples) -> list:
        """The step's samples with claimed-foreign text held to the run's budget (foreign_budget.py;
        train.other_tokenizer and train.foreign_budget on; the budget lives on the parts, run-long)."""
        p, t = self.parts, self.cfg.train
        if not t.bounds_other_tokenizer:
            return samples
        if p.budget is None:
            p.budget = ForeignBudget()
        return p.budget.apply(samples, learner_factors(samples, self.plausible()))

    def measure(self, groups: list[PeerGroup]) -> list:
        """What the groups set aside (peers never measured) would weigh in this round's step, without
        training on them: their IS weights under the weights the step starts from, in a pass of their
        own, so the step's gradient (and its divisor, the sample count) is exactly what it is without
        them. Not judged for plausibility (that would remember their n-grams as taught): a peer the
        judge refuses shows it once its samples train. Returns their ``PeerSampleUse``s."""
        if not groups:
            return []
        p, cfg = self.parts, self.cfg
        mb = build_batch([], groups, mode="vertical", scale=cfg.train.advantage_scale,
                         local=p.local_tokenizer, rules=p.sample_rules)
        if not mb.samples:
            return []
        try:
            stats = p.learner.compute_gradients(mb.samples, None, **self.objective_kwargs())
        except LearnerOOM:
            log.warning("out of memory measuring %d peer samples: measured in a later round", len(mb.samples))
            return []
        return peer_usage(mb.samples, stats.get("per_sample"), self.plausible())

    def plausible(self) -> PlausibilityConfig | None:
        """The learner's plausibility defence this round (train.peer_plausibility)."""
        return PlausibilityConfig() if self.cfg.train.peer_plausibility else None

    def watch_divergence(self, record: dict, samples, per_sample) -> None:
        """The node's own training collapsing: said in the record (the dashboard shows it) and,
        once per episode, in the log, with the likely cause and the setting to change."""
        kl = own_kl(samples, per_sample)
        record["kl/own_mean"] = kl
        message = self.parts.divergence.observe(record, kl)
        record["train/diverging"] = message
        if self.parts.divergence.is_new(message):
            log.warning("%s", message)

    # --- the swarm ------------------------------------------------------------------------
    def publish(self, groups: list[OwnGroup]) -> tuple[int, int]:
        """Send own groups to the swarm: (bytes, completion tokens) sent."""
        p, cfg, b = self.parts, self.cfg, self.parts.bundle
        horizontal = cfg.mode == "horizontal"
        nbytes = ntok = 0
        tb = p.token_bytes
        for g in groups:
            comps = [WireCompletion(token_ids=np.asarray(c.token_ids, dtype=np.int64),
                                    logprobs=np.asarray(c.logprobs, dtype=np.float32),
                                    text=c.text, reward=r, finish_reason=c.finish_reason,
                                    token_bytes=None if tb is None else tb.lengths(c.token_ids, c.text))
                     for c, r in zip(g.completions, g.rewards)]
            rollout = Rollout(
                rollout_id=uuid.uuid4().hex, node_id=p.node_id, swarm=cfg.swarm.name,
                task=p.task.tag_of(g.prompt.id), prompt_id=g.prompt.id, prompt_ids=None, group_id=g.group_id,
                group_index=0, group_size=cfg.task.num_generations if horizontal else len(comps),
                round=self.number, completions=comps, model_fp=b.fingerprint,
                tokenizer_fp=b.tokenizer_fingerprint, model_name=cfg.model_label, vocab_size=b.vocab_size,
                temperature=cfg.task.temperature, top_k=cfg.task.top_k, top_p=cfg.task.top_p,
                adapter_version=p.learner.version, sent_at=time.time())
            # encoded once, here: the bytes counted are the bytes sent
            data = encode(rollout, codec=p.swarm.codec, limits=p.swarm.limits)
            nbytes += len(data)
            ntok += sum(len(c.token_ids) for c in comps)
            p.swarm.publish_bytes(data, task=rollout.task, tok=rollout.tokenizer_fp)   # tags: filters
        return nbytes, ntok

    def share(self, groups: list[OwnGroup]) -> None:
        if self.cfg.swarm.share and groups:
            with self.cpu.measure("intake"):
                self.wire_out.add(*self.publish(groups))

    def poll(self, timeout_s: float) -> None:
        """Receive what the relay has for us (waiting at most ``timeout_s``) into intake."""
        p = self.parts
        with self.cpu.measure("intake"):
            items = p.swarm.poll(timeout_s=timeout_s)
            for it in items:
                if it.rollout is not None:
                    self.wire_in.add(it.nbytes, it.rollout.num_tokens)
            before = {id(g) for g in p.intake.buffer}
            p.intake.receive(items, self.number)
            self.note_arrivals([g for g in p.intake.buffer if id(g) not in before])
            self.admit()

    # --- the gates ----------------------------------------------------------------------------
    def gates(self) -> list[tuple[str, Callable]]:
        """The round's gates, in GATES order: (name, verdict of a buffered peer group). A group stays
        for the batch when every gate says KEEP; MEASURE sets it aside to be measured, not trained
        (while the round has room, kin.MAX_MEASURED; else it is dropped); DROP drops it, counted
        under the gate's name. Its outcome and kind were noted on arrival (note_arrivals)."""
        p, gates = self.parts, []
        if p.guard is not None:       # the guard's current level
            gates.append(("guard", lambda g: KEEP if p.guard.level == 0 or p.guard.admits(
                g.rollout.tokenizer_fp, g.rollout.model_fp, g.rollout.node_id) else DROP))
        rules = p.sample_rules
        if not rules.other_tokenizer or rules.other_tokenizer_peers:     # off, or only from named peers:
            gates.append(("other_tokenizer",            # the rest fills no slot and is not trained
                          lambda g: KEEP if g.same_tokenizer or rules.trains_other(g.rollout.node_id) else DROP))
        if p.worth is not None:
            gates.append(("worth", self.worth_verdict()))
        if p.kin is not None and self.cfg.swarm.fill == "kin":
            gates.append(("kin", self.kin_verdict))
        return gates

    def admit(self, only: tuple[str, ...] | None = None) -> None:
        """Intake's buffer through the round's gates (or the ones named in ``only``), one gate after
        another: the one place a round rewrites that buffer."""
        buffer = self.parts.intake.buffer
        for name, verdict in self.gates():
            if only is not None and name not in only:
                continue
            kept = []
            for g in buffer:
                said = verdict(g)
                if said == KEEP:
                    kept.append(g)
                elif said == MEASURE and len(self.to_measure) < MAX_MEASURED:
                    self.to_measure.append(g)
                else:
                    self.excluded[name] += 1
            buffer = kept
        self.parts.intake.buffer = buffer

    def worth_verdict(self) -> Callable:
        """fill_by_worth: a kind not worth an own group is dropped (its slot goes to own generation);
        a kind never measured has a few groups measured instead, not trained (Round.measure)."""
        worth, fp = self.parts.worth, self.parts.bundle.fingerprint
        allowed = {kind for kind in KINDS if worth.allows(kind)}    # decided once a round, in observe()

        def verdict(g) -> str:
            kind = peer_kind(g.same_tokenizer, g.rollout.model_fp, fp)
            return KEEP if kind in allowed else DROP if worth.measured(kind) else MEASURE
        return verdict

    def kin_verdict(self, g) -> str:
        """swarm.fill = "kin": only kin peers' groups may take own slots; a peer never measured has
        its groups measured, not trained (at most kin.MAX_MEASURED a round)."""
        kin, node = self.parts.kin, g.rollout.node_id
        return KEEP if kin.is_kin(node) else MEASURE if kin.measuring(node) else DROP

    # --- worth and outcomes (issue 48) ------------------------------------------------------
    def note_arrivals(self, groups) -> None:
        """Each peer group the intake accepted (graded locally): its kind, its outcome."""
        p = self.parts
        for g in groups:
            kind = peer_kind(g.same_tokenizer, g.rollout.model_fp, p.bundle.fingerprint)
            self.kind_of[g.rollout.node_id] = kind
            self.seen.append((kind, list(g.rewards), g.rollout.node_id))
            if p.hints is not None:
                p.hints.remember([g])
            if p.outcomes is not None:
                p.outcomes.add_peer(self.number, g.prompt, kind, g.rewards, peer=g.rollout.node_id)

    def take_measured(self, slots: int | None) -> list[PeerGroup]:
        """The groups set aside to be measured, under batch fill only (peers on top train anyway)."""
        taken, self.to_measure = (self.to_measure if slots is not None else []), []
        self.measured_groups = len(taken)
        return taken

    def weigh(self, own, uses) -> None:
        """After the step: the round's evidence to the worth and outcome books."""
        p = self.parts
        own_rewards = [r for g in own for r in g.rewards]
        if p.outcomes is not None:
            p.outcomes.add_own(own_rewards)
            p.outcomes.validate([(g.prompt.id, g.rewards) for g in own])     # the picks' peers, checked
        if p.worth is not None:
            # what each sample weighed in the step (0 dropped or refused; the learner's bounds applied)
            trained = [(self.kind_of.get(u.node_id, "other tokenizer"), u.step_weight, u.node_id) for u in uses]
            p.worth.observe(self.number, own_rewards, self.seen, trained)
        if p.kin is not None:
            p.kin.observe(self.number, own_rewards, [(node, rewards) for _, rewards, node in self.seen],
                          [(u.node_id, u.step_weight) for u in uses])

    def exchange_record(self, own) -> dict:
        """The round record's worth/… and prompts/… keys (docs/metrics.md)."""
        p = self.parts
        signal = [len(set(g.rewards)) > 1 for g in own]
        out = {"groups/own_signal_frac": statistics.fmean(signal) if signal else None}
        if p.worth is not None:
            out.update(p.worth.metrics())
            out["worth/excluded"] = self.excluded["worth"]
            out["worth/said"] = [describe(p.worth.worth(k), own_groups=len(own), batch=self.cfg.task.prompts_per_round)
                                 for k in KINDS if p.worth.seen[k]]
        if p.worth is not None or p.kin is not None:
            out["kin/measured"] = self.measured_groups
        if p.kin is not None:
            count, metrics = self.kin_now
            out.update(metrics)
            out["kin/excluded"] = self.excluded["kin"]
            said = p.kin.said(len(own), self.cfg.task.prompts_per_round, kin=count)
            out["kin/said"] = said
            if said != p.kin.last_said:                        # node.log: when it changes
                log.info("%s", said)
                p.kin.last_said = said
        if p.outcomes is not None:
            out["prompts/from_outcomes"] = self.choice.from_outcomes if self.choice else 0
            out["prompts/predicted_signal"] = self.choice.predicted_signal if self.choice else None
        return out

    def peer_limit(self, limit: int) -> int:
        """Peer groups the round may take: none while the guard has the node training alone."""
        guard = self.parts.guard
        return 0 if guard is not None and guard.level >= ALONE else limit

    # --- peers' groups --------------------------------------------------------------------
    def collect_peers(self, own_group_ids: set[str] | None, limit: int) -> tuple[list[PeerGroup], dict]:
        """Wait (bounded by swarm.max_wait_s) until ``limit`` peer groups are ready, then take
        them; a slow or absent peer never stalls the node. Vertical: at most
        swarm.max_groups_per_peer of one peer; which ones: intake's order, among what the gates kept."""
        p, cfg = self.parts, self.cfg
        limit = self.peer_limit(limit)
        t0 = time.time()
        deadline = t0 + (cfg.swarm.max_wait_s if limit else 0.0)
        per_peer = cfg.swarm.max_groups_per_peer if own_group_ids is None else None
        p.progress.phase(phases.WAITING, deadline=deadline, done=0, total=limit)
        while True:
            self.poll(min(0.2, max(0.0, deadline - time.time())))
            ready = p.intake.ready(self.number, limit, own_group_ids, per_peer)
            p.progress.advance(min(ready, limit), limit)
            if ready >= limit or time.time() >= deadline:
                break
        with self.cpu.measure("intake"):
            taken = p.intake.take(self.number, limit, own_group_ids, per_peer)
        counts = p.intake.pop_round_counts()
        return taken, {"time/peer_wait_s": time.time() - t0,
                       "wire/bytes_per_token_in": self.wire_in.per_token(),
                       "peers/groups_received": counts.get("received", 0),
                       "peers/rejected": counts.get("rejected", 0),
                       "peers/stale": counts.get("stale", 0),
                       **{f"peers/{k}": counts.get(k, 0)
                          for k in ("skipped_zero_advantage", "skipped_peer_cap", "skipped_surplus")}}

    def fill_batch(self, prompts, slots: int) -> Filled:
        """Batch fill: peers' groups replace part of the own generation, the batch stays B groups.

        1. take in what arrived while we trained (no wait); 2. generate and publish the own
        minimum (the round's first prompts); 3. wait at most swarm.max_wait_s for ``slots``
        fresh informative peer groups; 4. generate the shortfall from the round's next prompts.
        Prompts and seeds are the ones an isolated node uses for the same indices, so a node
        the swarm gives nothing trains on exactly its isolated batch.
        """
        self.poll(0.0)
        worth = self.parts.worth
        if worth is not None and not worth.fills() and not self.parts.intake.buffer:
            slots = 0       # no kind seen in the swarm is worth a slot: one generation, no wait for groups we would drop
        keep = len(prompts) - slots
        own, gen_s, tokens = self.generate(prompts[:keep])
        self.share(own)
        peers, peer_stats = self.collect_peers(None, slots)
        short = slots - len(peers)
        if short:
            more, more_s, more_tokens = self.generate(prompts[keep:keep + short], first=keep)
            self.share(more)
            own, gen_s, tokens = own + more, gen_s + more_s, tokens + more_tokens
        return Filled(own, peers, gen_s, tokens, topped_up=short, peer_stats=peer_stats)
