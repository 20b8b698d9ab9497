"""Peer rollouts on their way in: validate, rebuild the prompt, re-score, keep per-peer books.

Nothing a peer claims is trusted: the reward is recomputed here from the completion text
(within a total time budget, so a hostile peer cannot stall the node), the prompt is rebuilt
from (task, prompt id), and a peer whose rollouts keep failing validation or keep timing the
grader out is quarantined.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from .wire import Rollout


@dataclass
class PeerStats:
    node_id: str
    model: str = ""
    tokenizer: str = ""
    last_seen: float = 0.0
    sent: int = 0                    # rollouts that reached us from this peer
    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: dict = field(default_factory=lambda: defaultdict(int))
    samples_used: int = 0
    filtered: int = 0
    kl_sum: float = 0.0
    is_weight_sum: float = 0.0
    grader_timeouts: int = 0
    reward_mismatches: int = 0       # claimed reward != our grade
    consecutive_bad: int = 0
    quarantined: bool = False

    def record_use(self, use) -> None:
        """Add one of this peer's samples that a step trained on (``batch.PeerSampleUse``)."""
        self.samples_used += 1
        if use.kl is not None:
            self.kl_sum += use.kl
        if use.is_weight is not None:
            self.is_weight_sum += use.is_weight
        if use.dropped:
            self.filtered += 1

    def as_dict(self) -> dict:
        n = max(self.samples_used, 1)
        return {
            "model": self.model, "tokenizer": self.tokenizer, "last_seen": self.last_seen,
            "sent": self.sent, "accepted": self.accepted, "rejected": self.rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "acceptance_rate": self.accepted / self.sent if self.sent else None,
            "samples_used": self.samples_used,
            "kl_mean": self.kl_sum / n if self.samples_used else None,
            "is_weight_mean": self.is_weight_sum / n if self.samples_used else None,
            "filter_rate": self.filtered / n if self.samples_used else None,
            "grader_timeouts": self.grader_timeouts, "reward_mismatches": self.reward_mismatches,
            "quarantined": self.quarantined,
        }


@dataclass
class PeerGroup:
    """A peer's rollout that passed intake, with locally computed rewards."""
    rollout: Rollout
    prompt: object                   # the task's Prompt rebuilt from the prompt id
    rewards: list[float]
    arrived_round: int
    same_tokenizer: bool
    nbytes: int = 0


class PeerBook:
    """Per-peer statistics and the quarantine rule."""

    def __init__(self, quarantine_after: int = 5):
        self.quarantine_after = quarantine_after
        self.peers: dict[str, PeerStats] = {}

    def get(self, node_id: str) -> PeerStats:
        if node_id not in self.peers:
            self.peers[node_id] = PeerStats(node_id=node_id)
        return self.peers[node_id]

    def reject(self, node_id: str, reason: str) -> None:
        p = self.get(node_id)
        p.rejected += 1
        p.rejected_by_reason[reason] += 1
        p.consecutive_bad += 1
        if p.consecutive_bad >= self.quarantine_after and not p.quarantined:
            p.quarantined = True

    def accept(self, node_id: str) -> None:
        p = self.get(node_id)
        p.accepted += 1
        p.consecutive_bad = 0

    def snapshot(self) -> dict:
        return {nid: p.as_dict() for nid, p in self.peers.items()}


class Intake:
    """Turns received messages into PeerGroups, or rejections counted per peer."""

    def __init__(self, *, task, swarm: str, my_node_id: str, my_tokenizer_fp: str, vocab_size: int,
                 book: PeerBook, rescore_budget_s: float = 5.0, max_staleness: int = 2,
                 max_buffer: int = 256):
        self.task = task
        self.swarm = swarm
        self.my_node_id = my_node_id
        self.my_tokenizer_fp = my_tokenizer_fp
        self.vocab_size = vocab_size
        self.book = book
        self.rescore_budget_s = rescore_budget_s
        self.max_staleness = max_staleness
        self.max_buffer = max_buffer
        self.buffer: list[PeerGroup] = []
        self.round_counts: dict[str, int] = defaultdict(int)

    # --- step 1: cheap checks on arrival ----------------------------------------------
    def _check(self, rollout: Rollout) -> str | None:
        if rollout.swarm != self.swarm:
            return "wrong_swarm"
        if rollout.task != self.task.name:
            return "other_task"
        if not rollout.completions:
            return "empty"
        if rollout.group_index + len(rollout.completions) > rollout.group_size:
            return "bad_group"
        if rollout.tokenizer_fp == self.my_tokenizer_fp:
            for c in rollout.completions:
                if len(c.token_ids) and int(max(c.token_ids)) >= self.vocab_size:
                    return "id_out_of_range"
        return None

    def receive(self, items, current_round: int) -> None:
        """Take a batch of swarm.Received items; valid ones are re-scored and buffered."""
        fresh: list[tuple[Rollout, object, int]] = []
        for item in items:
            sender = item.sender or (item.rollout.node_id if item.rollout else "?")
            if sender == self.my_node_id:
                continue
            peer = self.book.get(sender)
            peer.sent += 1
            peer.last_seen = time.time()
            self.round_counts["received"] += 1
            if peer.quarantined:         # counted, but not towards quarantine again
                peer.rejected += 1
                peer.rejected_by_reason["quarantined"] += 1
                self.round_counts["rejected"] += 1
                continue
            if item.error is not None or item.rollout is None:
                reason = getattr(item.error, "reason", "decode")
                self.book.reject(sender, reason)
                self.round_counts["rejected"] += 1
                continue
            r = item.rollout
            peer.model, peer.tokenizer = r.model_name, r.tokenizer_fp
            reason = self._check(r)
            prompt = None
            if reason is None:
                try:
                    prompt = self.task.get(r.prompt_id)
                except Exception:  # any failure to rebuild means we cannot grade it
                    reason = "unknown_prompt"
            if reason is not None:
                self.book.reject(sender, reason)
                self.round_counts["rejected"] += 1
                continue
            fresh.append((r, prompt, item.nbytes))
        if fresh:
            self._rescore(fresh, current_round)

    # --- step 2: re-score every completion locally, within one total budget ---------------
    def _rescore(self, fresh, current_round: int) -> None:
        texts, refs, owners = [], [], []
        for k, (r, prompt, _) in enumerate(fresh):
            for c in r.completions:
                texts.append(c.text)
                refs.append(prompt.reference)
                owners.append(k)
        results = self.task.reward_many(texts, refs, total_budget_s=self.rescore_budget_s)
        per_rollout: dict[int, list] = defaultdict(list)
        for k, res in zip(owners, results):
            per_rollout[k].append(res)
        for k, (r, prompt, nbytes) in enumerate(fresh):
            peer = self.book.get(r.node_id)
            grades = per_rollout[k]
            timeouts = sum(1 for _, b in grades if b.get("timed_out"))
            peer.grader_timeouts += timeouts
            if timeouts == len(grades):
                self.book.reject(r.node_id, "grader_timeout")
                self.round_counts["rejected"] += 1
                continue
            rewards = [float(v) for v, _ in grades]
            peer.reward_mismatches += sum(
                1 for c, v in zip(r.completions, rewards) if abs(float(c.reward) - v) > 1e-6)
            self.book.accept(r.node_id)
            self.round_counts["accepted"] += 1
            self.buffer.append(PeerGroup(rollout=r, prompt=prompt, rewards=rewards,
                                         arrived_round=current_round,
                                         same_tokenizer=r.tokenizer_fp == self.my_tokenizer_fp,
                                         nbytes=nbytes))
        if len(self.buffer) > self.max_buffer:              # keep the newest
            self.round_counts["dropped_overflow"] += len(self.buffer) - self.max_buffer
            self.buffer = self.buffer[-self.max_buffer:]

    # --- step 3: hand fresh groups to the learner ------------------------------------------
    def take(self, current_round: int, limit: int, group_ids: set[str] | None = None) -> list[PeerGroup]:
        """Pop up to ``limit`` groups not older than max_staleness rounds (newest first).

        With ``group_ids`` (horizontal mode) only parts of those groups are taken.
        """
        keep, stale = [], 0
        for g in self.buffer:
            if current_round - g.arrived_round > self.max_staleness:
                stale += 1
            else:
                keep.append(g)
        self.round_counts["stale"] += stale
        chosen, rest = [], []
        for g in reversed(keep):
            wanted = group_ids is None or g.rollout.group_id in group_ids
            if wanted and len(chosen) < limit:
                chosen.append(g)
            else:
                rest.append(g)
        self.buffer = list(reversed(rest))
        return chosen

    def pop_round_counts(self) -> dict:
        out = dict(self.round_counts)
        self.round_counts.clear()
        return out
