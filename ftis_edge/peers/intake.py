"""Peer rollouts on their way in: validate, rebuild the prompt, re-score, keep per-peer books.

Nothing a peer claims is trusted (docs/relay.md, "Threat model"):

* the header must fit: our swarm and task, a sane sampler (0 < T <= 2, 0 < top-p <= 1,
  top-k >= 0), a known finish reason, and no more completions than the node's own group
  size G (``max_group_completions``; else ``MAX_GROUP_COMPLETIONS``), so one group cannot
  fill a batch;
* the prompt is rebuilt from (task, prompt id) and must be one the task lets us train on,
  never a held-out eval prompt (``Task.is_trainable``);
* same tokenizer: the token ids that will train must be exactly the graded text's tokens:
  ``decode(ids) == text`` with our tokenizer (special tokens rendered, no clean-up), the
  stop token excluded when the completion stopped. Not ``encode(text) == ids``: a sampled
  sequence is often not the canonical tokenization of its own text (3 of 96 honest HF
  completions in a measurement), and a completion cut mid-character ends in U+FFFD, which
  re-encodes differently;
* the reward is recomputed here from the text, within a total time budget a round shared
  across senders one turn at a time in the order ``grading.GradingRound`` gives (classes by
  what the node knows of a sender, then turns, then waiting time), so neither many ids nor ids
  whose answers grade just under the limit can keep an honest peer's group ungraded, and new ids
  cannot push known useful peers out. A rollout with an answer on which the grader overran
  with its whole per-answer timeout is refused (``grader_timeout``) and counts towards its sender's
  quarantine; one cut short by its slice, or that the budget or the workers did not reach in
  full, is refused as ``no_grading_time`` and does not;
* a peer whose rollouts are refused at a high rate over a sliding window is quarantined,
  with the reason logged and kept in its book; a change of its model or tokenizer
  fingerprint mid-run is logged and counted.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..rollout.samples import carries_signal
from ..common.text_safety import terminal_safe
from ..tasks.grader import get_grader
from ..tasks.rewards import check_format
from ..rollout.wire import Rollout, WireCompletion
from .book import PeerBook
from .grading import GROUP_SLICE, GradingRing, GradingRound, Standing

log = logging.getLogger("ftis_edge.peers.intake")

# Reasons intake itself gives (wire.REASONS come on top, from messages that do not decode).
REASONS = ("wrong_swarm", "other_task", "empty", "bad_group", "bad_sampler", "bad_finish",
           "id_out_of_range", "token_text_mismatch", "unknown_prompt", "eval_prompt",
           "grader_timeout", "quarantined", "group_too_large", "no_grading_time")
MAX_TEMPERATURE = 2.0
MAX_GROUP_COMPLETIONS = 64     # completions one peer group may hold, when the node sets no cap of its own
FINISH_REASONS = ("stop", "length")


def ids_decoder(tokenizer) -> Callable[[Sequence[int]], str]:
    """The local decode the ids-to-text check uses: every token rendered, special ones too
    (so control tokens cannot hide in the ids), and no clean-up of spaces."""
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
    return decode


def sampler_problem(r: Rollout) -> str | None:
    """Sampler settings outside sane bounds (the behaviour log-probs would mean little)."""
    t, p = float(r.temperature), float(r.top_p)
    if not (math.isfinite(t) and 0.0 < t <= MAX_TEMPERATURE and math.isfinite(p) and 0.0 < p <= 1.0
            and int(r.top_k) >= 0):
        return "bad_sampler"
    return None


def token_text_problem(c: WireCompletion, decode: Callable[[Sequence[int]], str],
                       stop_ids: frozenset, stop_texts: Sequence[str] = ()) -> str | None:
    """Why a same-tokenizer completion's ids are not its text's tokens, or None.

    A "stop" completion ends in one of two ways, as our own generator ends it (generate/stops.py):
    a stop token as its last id (both backends keep it in the ids and leave it out of the text),
    or, for a model prompted in the plain format, a stop text (``\nUser:``) that its last token
    completes for the first time (those tokens stay in the ids and in the text). A stop token
    anywhere else ends generation, so it may not sit inside; everything must decode to the text.
    """
    ids = c.token_ids
    stops = np.isin(ids, np.fromiter(stop_ids, dtype=np.int64, count=len(stop_ids)))
    by_text = False
    if c.finish_reason == "stop":
        if not len(ids):
            return "bad_finish"
        if stops[-1]:
            ids, stops = ids[:-1], stops[:-1]
        elif stop_texts:
            by_text = True
        else:
            return "bad_finish"
    if stops.any():                      # generation ends at the first stop token
        return "bad_finish"
    try:
        if decode(ids.tolist()) != c.text:
            return "token_text_mismatch"
        if by_text and not _first_stop_text_at_end(ids.tolist(), c.text, decode, stop_texts):
            return "bad_finish"
    except Exception:  # noqa: BLE001 - whatever our tokenizer makes of these ids, not that text
        return "token_text_mismatch"
    return None


def _first_stop_text_at_end(ids: list[int], text: str, decode, stop_texts: Sequence[str]) -> bool:
    """The text holds a stop text and the text without the last token holds none: the stop rule
    fired at the last token, not before (an earlier one would have ended the completion there)."""
    if not any(t in text for t in stop_texts):
        return False
    before = decode(ids[:-1])
    return not any(t in before for t in stop_texts)


@dataclass
class PeerGroup:
    """A peer's rollout that passed intake, with locally computed rewards."""
    rollout: Rollout
    prompt: object                   # the task's Prompt rebuilt from the prompt id
    rewards: list[float]
    arrived_round: int
    same_tokenizer: bool
    nbytes: int = 0


def overran(breakdown: dict) -> bool:
    """Did grading this answer run past its timeout (the grader killed the worker on it)?
    Other timeouts (no worker ready, no time left in the budget) are not the answer's doing."""
    return bool(breakdown.get("timed_out")) and str(breakdown.get("reason", "")).startswith("grading took longer")


def _answer_len(text: str) -> int:
    """Length of the answer the grader will compare (linear time; a prior for its cost)."""
    answer = check_format(text).answer if isinstance(text, str) else None
    return len(answer) if answer is not None else 0


class Intake:
    """Turns received messages into PeerGroups, or rejections counted per peer.

    ``decode`` turns our token ids into text (``ids_decoder(tokenizer)``) and ``stop_ids``
    are our end-of-generation ids, ``stop_texts`` the texts that end a plain-format turn
    (``ModelBundle.stop_texts``): with them a same-tokenizer peer's ids are checked against its
    text and its end.
    """

    def __init__(self, *, task, swarm: str, my_node_id: str, my_tokenizer_fp: str, vocab_size: int,
                 book: PeerBook, decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int],
                 stop_texts: Sequence[str] = (),
                 rescore_budget_s: float = 5.0, max_staleness: int = 2, max_buffer: int = 256,
                 max_group_completions: int = MAX_GROUP_COMPLETIONS):
        self.task = task
        self.swarm = swarm
        self.my_node_id = my_node_id
        self.my_tokenizer_fp = my_tokenizer_fp
        self.vocab_size = vocab_size
        self.book = book
        self.decode = decode
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.stop_texts = tuple(t for t in stop_texts if t)
        self.rescore_budget_s = rescore_budget_s
        self.max_staleness = max_staleness
        self.max_buffer = max_buffer
        self.max_group_completions = max_group_completions
        self._grader_killed = False      # the last grading killed a worker (an answer overran)
        self._ring = GradingRing()       # where the grading round-robins stopped (run-long, bounded)
        self.buffer: list[PeerGroup] = []
        self.round_counts: dict[str, int] = defaultdict(int)

    # --- step 1: checks on arrival, cheapest first -----------------------------------------
    def _check_header(self, r: Rollout) -> str | None:
        if r.swarm != self.swarm:
            return "wrong_swarm"
        if r.task != self.task.tag_of(r.prompt_id):     # the tag must be the one of its prompt
            return "other_task"
        if not r.completions:
            return "empty"
        if len(r.completions) > self.max_group_completions:
            return "group_too_large"
        if r.group_index + len(r.completions) > r.group_size:
            return "bad_group"
        if sampler_problem(r):
            return "bad_sampler"
        if any(c.finish_reason not in FINISH_REASONS for c in r.completions):
            return "bad_finish"
        return None

    def _check_prompt(self, r: Rollout):
        """(prompt, None) or (None, reason)."""
        try:
            prompt = self.task.get(r.prompt_id)
        except Exception:  # any failure to rebuild means we cannot grade it
            return None, "unknown_prompt"
        if not self.task.is_trainable(r.prompt_id):
            return None, "eval_prompt"
        return prompt, None

    def _check_tokens(self, r: Rollout) -> str | None:
        if r.tokenizer_fp != self.my_tokenizer_fp:
            return None                  # re-tokenized from the text by the learner
        for c in r.completions:
            if len(c.token_ids) and int(max(c.token_ids)) >= self.vocab_size:
                return "id_out_of_range"
        for c in r.completions:
            reason = token_text_problem(c, self.decode, self.stop_ids, self.stop_texts)
            if reason:
                return reason
        return None

    def _refuse(self, sender: str, reason: str, charged: bool = True) -> None:
        self.book.reject(sender, reason, charged)
        self.round_counts["rejected"] += 1

    def receive(self, items, current_round: int) -> None:
        """Take a batch of swarm.Received items; valid ones are re-scored and buffered."""
        fresh: list[tuple[str, Rollout, object, int]] = []
        for item in items:
            # peer-chosen strings get printed (Peers tab, node.log): no control or bidi characters
            sender = terminal_safe(item.sender or (item.rollout.node_id if item.rollout else "?"))
            if sender == self.my_node_id:
                continue
            peer = self.book.get(sender)
            peer.sent += 1
            peer.last_seen = time.time()
            self.round_counts["received"] += 1
            if peer.quarantined:
                self._refuse(sender, "quarantined")
                continue
            if item.error is not None or item.rollout is None:
                self._refuse(sender, getattr(item.error, "reason", "decode"))
                continue
            r = item.rollout
            r.node_id, r.model_name, r.model_fp, r.tokenizer_fp = (
                sender, *map(terminal_safe, (r.model_name, r.model_fp, r.tokenizer_fp)))
            self.book.note_fingerprints(sender, r)
            prompt, reason = None, self._check_header(r)
            if reason is None:
                prompt, reason = self._check_prompt(r)
            if reason is None:
                reason = self._check_tokens(r)
            if reason is not None:
                self._refuse(sender, reason)
                continue
            fresh.append((sender, r, prompt, item.nbytes))
        if fresh:
            self._rescore(fresh, current_round)

    # --- step 2: re-score every completion locally, the budget shared across senders -------
    def _grade(self, fresh) -> tuple[dict[int, list], dict[str, float | None]]:
        """Grades of the fresh rollouts the budget reached (index -> [(reward, breakdown)]) and
        what each graded sender's answers cost per answer (its ``grade_s``), one
        sender's turn at a time as ``grading.GradingRound`` orders them; a rollout stops at its
        first answer that times out (the rest are not graded: each would cost a grader worker)."""
        budget = self.rescore_budget_s
        turns = GradingRound(budget, self.task.reward_settings.timeout_s, time.monotonic(), self._ring)
        queues: dict[str, list[int]] = defaultdict(list)
        for k, (sender, _, _, _) in enumerate(fresh):
            queues[sender].append(k)
        for s, ks in queues.items():
            peer = self.book.peers.get(s)        # read, not made: one evicted since is a newcomer
            turns.add(s, Standing() if peer is None else
                      Standing(peer.grade_s, any(peer.signal_recent), peer.grader_timeouts > 0),
                      ks, [len(fresh[k][1].completions) for k in ks],
                      max(_answer_len(c.text) for k in ks for c in fresh[k][1].completions))
        if self._grader_killed:  # an overrun last time killed workers: let them restart (a hot spare
            # takes over at once after one kill, so within a call one overrun costs no one else)
            get_grader().warm_up(timeout=budget / 2)
            self._grader_killed = False
        grades: dict[int, list] = {}
        costs: dict[str, float | None] = {}
        while (turn := turns.next(time.monotonic())) is not None:
            peer = self.book.peers.get(turn.sender)     # not made again if evicted since it arrived
            grade_s = peer.grade_s if peer is not None else None
            used, killed = 0, False
            for k in turn.items:
                if time.monotonic() >= turn.until:
                    break
                _, r, prompt, _ = fresh[k]
                grades[k] = self._grade_rollout(r, prompt.reference, turn.until)
                used += 1
                graded_s = [b["seconds"] for _, b in grades[k] if "seconds" in b]
                if graded_s:                      # what its answers cost: its place next time
                    per = sorted(graded_s)[len(graded_s) // 2]      # the median: not one cold start
                    grade_s = per if grade_s is None else 0.5 * grade_s + 0.5 * per
                killed = any(overran(b) for _, b in grades[k])
                if killed or any(b.get("share_spent") for _, b in grades[k]):
                    # a killed worker restarts: wait for it inside this turn, so the restart
                    # is paid from this sender's time (and the newcomers' share), not the next's
                    self._grader_killed = not get_grader().warm_up(
                        timeout=max(0.0, min(GROUP_SLICE * budget, turns.deadline - time.monotonic())))
                    break
            if peer is not None:
                peer.grade_s = grade_s
            costs[turn.sender] = grade_s
            turns.done(turn, time.monotonic(), used, grade_s, killed)
        return grades, costs

    def _grade_rollout(self, r: Rollout, reference: str, until: float) -> list:
        """An answer that times out is charged to its sender only when it had the whole
        per-answer timeout; cut short by its share of the round, it is just not graded."""
        out, stop = [], False
        timeout_s = self.task.reward_settings.timeout_s
        for c in r.completions:
            left = until - time.monotonic()
            stop = stop or bool(out) and (overran(out[-1][1]) or out[-1][1].get("share_spent", False))
            if stop or left <= 0:
                out.append((0.0, {"timed_out": True, "reason": "not graded: an earlier answer overran, or its share was used up"}))
                continue
            graded = self.task.reward_many([c.text], [reference], total_budget_s=left)
            if left < timeout_s and overran(graded[0][1]):
                value, b = graded[0]
                graded = [(0.0, {**b, "reason": "not graded: its share of the round's budget was used up",
                                 "share_spent": True})]
            out += graded
        return out

    def _rescore(self, fresh, current_round: int) -> None:
        graded, costs = self._grade(fresh)
        for k, (sender, r, prompt, nbytes) in enumerate(fresh):
            peer = self.book.peers.get(sender)   # evicted since it arrived: not made again to refuse it
            if peer is not None and peer.quarantined:   # quarantined by a later message of the same batch
                self._refuse(sender, "quarantined")
                continue
            if k not in graded:          # the round's budget ran out first: not this peer's doing
                self._refuse(sender, "no_grading_time", charged=False)
                continue
            grades = graded[k]
            overruns = sum(1 for _, b in grades if overran(b))
            if overruns:                 # its own answer made the grader overrun: charged to it
                self.book.get(sender).grader_timeouts += overruns
                self._refuse(sender, "grader_timeout")
                continue
            if any(b.get("timed_out") for _, b in grades):   # no worker or no time left: not its doing
                self._refuse(sender, "no_grading_time", charged=False)
                continue
            rewards = [float(v) for v, _ in grades]
            if peer is None:             # evicted since it arrived: booked again, as seen and graded now
                peer = self.book.get(sender)
                peer.last_seen, peer.grade_s = time.time(), costs.get(sender)
            peer.reward_mismatches += sum(
                1 for c, v in zip(r.completions, rewards) if abs(float(c.reward) - v) > 1e-6)
            self.book.accept(sender, carries_signal(rewards))
            self.round_counts["accepted"] += 1
            self.buffer.append(PeerGroup(rollout=r, prompt=prompt, rewards=rewards,
                                         arrived_round=current_round,
                                         same_tokenizer=r.tokenizer_fp == self.my_tokenizer_fp,
                                         nbytes=nbytes))
        if len(self.buffer) > self.max_buffer:              # keep the newest
            self.round_counts["dropped_overflow"] += len(self.buffer) - self.max_buffer
            self.buffer = self.buffer[-self.max_buffer:]

    # --- step 3: hand fresh groups to the learner ------------------------------------------
    def _select(self, current_round: int, limit: int, group_ids: set[str] | None,
                per_peer: int | None) -> tuple[list[PeerGroup], list[PeerGroup], dict]:
        """(chosen, kept for later rounds, counts): the choice ``take`` makes, without taking.

        Horizontal (``group_ids``): parts of those groups, newest first (a part's own rewards
        may be equal while the merged group's are not). Otherwise every group whose re-graded
        rewards differ comes before any whose rewards are all equal (zero advantage: nothing
        to learn), each kind spread round-robin over peers, each peer's newest first, at most
        ``per_peer`` of one peer, so no single peer fills the batch.
        """
        fresh = [g for g in self.buffer if current_round - g.arrived_round <= self.max_staleness]
        counts = {"stale": len(self.buffer) - len(fresh)}
        if group_ids is not None:
            chosen = [g for g in reversed(fresh) if g.rollout.group_id in group_ids][:limit]
            kept = fresh
        else:
            informative = [g for g in fresh if carries_signal(g.rewards)]
            zero = [g for g in fresh if not carries_signal(g.rewards)]
            cap = per_peer if per_peer is not None else len(fresh)
            chosen, seen = [], Counter()
            counts.update(skipped_zero_advantage=0, skipped_peer_cap=0, skipped_surplus=0)
            for g in _spread_over_peers(informative) + _spread_over_peers(zero):
                node = g.rollout.node_id
                if seen[node] < cap and len(chosen) < limit:
                    chosen.append(g)
                elif not carries_signal(g.rewards):
                    counts["skipped_zero_advantage"] += 1
                elif seen[node] >= cap:
                    counts["skipped_peer_cap"] += 1
                else:
                    counts["skipped_surplus"] += 1
                seen[node] += 1
            kept = informative            # a zero-advantage group left over is dropped: it never helps
        taken = {id(g) for g in chosen}
        return chosen, [g for g in kept if id(g) not in taken], counts

    def ready(self, current_round: int, limit: int, group_ids: set[str] | None = None,
              per_peer: int | None = None) -> int:
        """How many groups ``take`` would hand over now (nothing is taken)."""
        return len(self._select(current_round, limit, group_ids, per_peer)[0])

    def take(self, current_round: int, limit: int, group_ids: set[str] | None = None,
             per_peer: int | None = None) -> list[PeerGroup]:
        """Pop up to ``limit`` groups not older than max_staleness rounds: informative first,
        spread over peers (at most ``per_peer`` of one), newest first (``_select``).

        Stale groups leave the buffer, and so do zero-advantage groups not taken; informative
        groups over a peer's cap or beyond the limit stay for a later round while fresh. What
        was skipped and why is added to the round counts (``pop_round_counts``: stale,
        skipped_zero_advantage, skipped_peer_cap, skipped_surplus).
        """
        chosen, kept, counts = self._select(current_round, limit, group_ids, per_peer)
        for k, n in counts.items():
            self.round_counts[k] += n
        self.buffer = kept
        return chosen

    def pop_round_counts(self) -> dict:
        out = dict(self.round_counts)
        self.round_counts.clear()
        return out


def _spread_over_peers(groups: list[PeerGroup]) -> list[PeerGroup]:
    """``groups`` (in arrival order) round-robin over their peers: every peer's newest, then
    every peer's second newest, ...; peers in the order of their newest group."""
    by_peer: dict[str, list[PeerGroup]] = {}
    for g in reversed(groups):
        by_peer.setdefault(g.rollout.node_id, []).append(g)
    depth = max((len(gs) for gs in by_peer.values()), default=0)
    return [gs[k] for k in range(depth) for gs in by_peer.values() if k < len(gs)]
