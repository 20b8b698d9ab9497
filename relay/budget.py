"""Delivery budgets: a subscriber's K rollouts per window, shared fairly across publishers
(docs/relay.md, "Delivery budgets"). The rules only: no socket, and the time is always given
(`now`), so they are tested with a made-up clock.

Sybil resistance (many fake ids must not crowd out an honest publisher). A subscriber names the
publishers it found useful (USEFUL; the node: those whose recent groups it trained on and that
carried a learning signal). Every other publisher is either a newcomer (never delivered to this
subscriber) or tried (delivered, and not named useful since: junk, or not judged yet).

- While a useful publisher is active, the useful ones share K minus a trial slice (K // 8, at
  least 1); everyone else shares only that slice, one rollout each. Unguarded (nobody useful
  active: a node that has trained on nobody yet), every publisher gets the plain fair share.
- Newcomers go first in the trial slice (both modes), one each: the one whose source (address
  or CURVE key) has had the fewest newcomers tried, then whose source has the fewest
  publishers (a crowd of 200 ids arriving with an honest publisher from elsewhere took its
  first slot), the newest among equals. So however many ids
  came first, a new honest publisher is tried within a window or two: a crowd that came first
  was either tried already (and, unless the subscriber found it useful, drops behind) or is
  older; a crowd that keeps making fresh ids from one source raises that source's count and
  falls behind a source that has had fewer tried.
- Then the tried, not-useful ones, the one that has waited longest first (a rotation), so a
  publisher judged useless by bad luck gets another chance and junk gets no more than the slice."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from relay.topic import Entry, Index


SOURCE_MEMORY = 4096          # sources whose newcomer counts a budget remembers (the largest kept)


@dataclass
class Budget:
    """A subscriber's delivery budget on one topic: at most k rollouts per window_s, at most
    a fair share per publisher, from rollouts not older than one window."""

    k: int
    window_s: float
    index: Index | None = None
    start_seq: int = 1        # rollouts from here on (the SUB's cursor) are candidates
    window_start: float = 0.0
    pick_at: float = 0.0      # candidates gather until then, so a pick sees every publisher
    sent: int = 0
    served: collections.Counter = field(default_factory=collections.Counter)   # sender -> this window
    sent_seqs: set = field(default_factory=set)     # seqs sent to it that are still fresh
    useful: frozenset = frozenset()                 # publishers it said were useful (USEFUL)
    probation_sent: int = 0                         # this window, to publishers not in useful
    newcomers_sent: int = 0                         # this window, to publishers never sent before
    turns: dict = field(default_factory=dict)       # sender -> its place in the rotation (lower: sooner)
    turn: int = 0                                   # deliveries made so far: the rotation's clock
    tried: set = field(default_factory=set)         # publishers sent to it at least once
    source_tries: collections.Counter = field(default_factory=collections.Counter)  # source -> newcomers tried
    none_new: tuple = ()                            # (arrivals, window) when a search found no newcomer

    def window_over(self, now: float) -> bool:
        return now - self.window_start >= self.window_s

    def new_window(self, now: float, entries: dict) -> None:
        """Budget and shares reset; sent seqs are remembered only while still fresh."""
        self.window_start, self.sent, self.pick_at, self.probation_sent = now, 0, 0.0, 0
        self.newcomers_sent = 0
        self.served.clear()
        live = self.index.newest if self.index is not None else None
        if live is not None and max(len(self.turns), len(self.tried)) > len(live):   # forget the gone
            self.turns = {s: t for s, t in self.turns.items() if s in live}
            self.tried = {s for s in self.tried if s in live}
        if len(self.source_tries) > SOURCE_MEMORY:      # forgetting a small count only favours it
            self.source_tries = collections.Counter(dict(self.source_tries.most_common(SOURCE_MEMORY // 2)))
        stale = now - self.window_s
        self.sent_seqs = {s for s in self.sent_seqs if (e := entries.get(s)) is not None and e.t >= stale}

    def record(self, e: Entry) -> None:
        """One delivery made from this budget."""
        self.sent_seqs.add(e.seq)
        self.served[e.sender] += 1
        self.turn += 1
        self.turns[e.sender] = self.turn         # to the back of the rotation
        self.sent += 1
        if e.sender not in self.tried:
            self.tried.add(e.sender)
            if e.sender not in self.useful:           # a newcomer tried (a useful one was tried before)
                self.newcomers_sent += 1
                self.source_tries[e.source] += 1
        if e.sender not in self.useful:
            self.probation_sent += 1

    @property
    def probation(self) -> int:
        """Rollouts per window that publishers not named useful share while a useful one is
        active; also how many newcomers a window tries first in either mode."""
        return max(1, self.k // 8)

    def fair_share(self, node_id: bytes, now: float, entries: dict) -> tuple[int, bool]:
        """(share, guarded). Unguarded (no useful publisher active): k / active publishers,
        rounded up, over the publishers this subscriber can be offered (those whose rollouts
        pass its filters), not counting itself. Guarded: (k - probation) / active useful
        publishers for each of them, and the probation slice for all the others together."""
        index = self.index
        n_useful = sum(1 for s in self.useful if s != node_id and index.is_active(s, now, self.window_s, entries))
        if n_useful:
            return max(1, -(-(self.k - self.probation) // n_useful)), True
        active = index.active_senders(now, self.window_s, entries)
        active -= index.is_active(node_id, now, self.window_s, entries)
        return max(1, -(-self.k // max(1, active))), False

    def _newest_unsent(self, seqs, rid: bytes, stale: float, entries: dict) -> Entry | None:
        """A publisher's newest rollout not yet sent to this subscriber, still fresh."""
        sent, start = self.sent_seqs, self.start_seq
        for s in reversed(seqs):
            if s < start:
                break
            if s in sent:
                continue
            e = entries.get(s)
            if e is None or e.t < stale:
                break
            if e.sender_rid == rid:               # a bridge: not back to where it came from
                continue
            return e
        return None

    def pick(self, node_id: bytes, rid: bytes, now: float, entries: dict, share: int,
             guarded: bool = False) -> Entry | None:
        """The next pick for subscriber (node_id, routing id rid): guarded, a useful publisher
        below `share` first (least served, then longest waiting); then, while the trial slice
        lasts (guarded) or while anyone is below `share` (unguarded), a newcomer first (see the
        module docstring), else the one whose turn came longest ago (one each when guarded).
        None when no publisher has a candidate. The activity scan looks at most max(64K, 256)
        publishers (the most recently active first); useful ones are always looked at."""
        served, newest = self.served, self.index.newest
        stale = now - self.window_s
        best, best_n = None, share
        turns = self.turns
        if guarded:
            # the useful share K - probation: the probation slice stays for the others, however
            # many useful ids there are (fake ids can earn "useful" with cheap valid groups)
            if self.sent - self.probation_sent < self.k - self.probation:
                best_key = (best_n, 0)
                for sender in self.useful:
                    seqs = newest.get(sender)
                    if seqs is None or sender == node_id:
                        continue
                    key = (served[sender] if sender in served else 0, turns.get(sender, 0))
                    if key < best_key and (e := self._newest_unsent(seqs, rid, stale, entries)) is not None:
                        best, best_key = e, key
            if best is not None or self.probation_sent >= self.probation:
                return best
            best_n = 1                                # probation: one each
        if self.newcomers_sent < self.probation and self.none_new != (self.index.arrivals, self.window_start):
            new = self._newcomer(node_id, rid, stale, entries, guarded)
            if new is not None:
                return new
            self.none_new = (self.index.arrivals, self.window_start)   # no search again before one arrives
        looked, clock = 0, self.turn - 0.5      # first seen: ahead of the one served last only
        best_key = (best_n, 0)
        for sender in reversed(newest):
            seqs = newest[sender]
            last = entries.get(seqs[-1])
            if last is None or last.t < stale:        # activity order: every later one is older
                break
            if sender == node_id or (guarded and sender in self.useful):   # never your own
                continue
            looked += 1
            if looked > max(64 * self.k, 256):
                break
            n = served[sender] if sender in served else 0
            if n >= best_n:
                continue
            turn = turns.get(sender)
            if turn is None:
                turn = turns[sender] = clock          # first seen: behind those already waiting
            if best is not None and (n, turn) >= best_key:
                continue
            e = self._newest_unsent(seqs, rid, stale, entries)
            if e is not None:
                best, best_key = e, (n, turn)
        return best

    def _newcomer(self, node_id: bytes, rid: bytes, stale: float, entries: dict, guarded: bool) -> Entry | None:
        """The newest publisher never sent to this subscriber from the source that has had the
        fewest tried, among those the one with the fewest publishers (a crowd arriving with or
        after a newcomer from elsewhere is newer, but not first), with a fresh rollout; None if
        none. Looks at the 256 sources with the latest arrivals and, in each, at most 64
        publishers (newest first)."""
        newest, tried, tries = self.index.newest, self.tried, self.source_tries
        best, best_key = None, None
        for looked, (source, arrived) in enumerate(reversed(self.index.sources.items())):
            if looked >= 256:
                break
            n_tried = tries[source] if source in tries else 0
            size = len(arrived)
            if best_key is not None and (n_tried, size) > best_key[:2]:
                continue
            for i, (order, sender) in enumerate(reversed(arrived)):
                if i >= 64 or (best_key is not None and (n_tried, size, -order) >= best_key):
                    break
                if sender in tried or sender == node_id or (guarded and sender in self.useful):
                    continue
                seqs = newest.get(sender)
                e = self._newest_unsent(seqs, rid, stale, entries) if seqs is not None else None
                if e is not None:
                    best, best_key = e, (n_tried, size, -order)
                    break
        return best
