"""Delivery budgets: a subscriber's K rollouts per window, shared fairly across publishers,
newest first (docs/relay.md, "Delivery budgets"). The rules only: no socket, and the time is
always given (`now`), so they are tested with a made-up clock.

Sybil resistance (issue 25.2): a subscriber names the publishers it found useful (USEFUL, the
node: those whose groups it trained on). While one of them is active, the useful publishers
share the budget but a probation slice, and every other id (fresh, unknown: what a crowd of
fake identities is) shares only that slice, one rollout each, so no number of fresh ids can
spend what an honest, useful publisher would get. With no useful publisher active, every
publisher gets the plain fair share (a node that has trained on nobody yet)."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from relay.topic import Entry, Index


@dataclass
class Budget:
    """A subscriber's delivery budget on one topic: at most k rollouts per window_s, at most
    a fair share per publisher, newest first, from rollouts not older than one window."""

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

    def window_over(self, now: float) -> bool:
        return now - self.window_start >= self.window_s

    def new_window(self, now: float, entries: dict) -> None:
        """Budget and shares reset; sent seqs are remembered only while still fresh."""
        self.window_start, self.sent, self.pick_at, self.probation_sent = now, 0, 0.0, 0
        self.served.clear()
        stale = now - self.window_s
        self.sent_seqs = {s for s in self.sent_seqs if (e := entries.get(s)) is not None and e.t >= stale}

    def record(self, e: Entry) -> None:
        """One delivery made from this budget."""
        self.sent_seqs.add(e.seq)
        self.served[e.sender] += 1
        self.sent += 1
        if e.sender not in self.useful:
            self.probation_sent += 1

    @property
    def probation(self) -> int:
        """Rollouts per window that publishers not named useful share while a useful one is active."""
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
        below `share` first (least served), else, while the probation slice lasts, another
        publisher never served this window; unguarded, newest activity first, the first
        publisher never served this window, else the least served one below `share`. None
        when no publisher has a candidate. The activity scan looks at most max(8K, 32)
        publishers (the most recently active first); useful ones are always looked at."""
        served, newest = self.served, self.index.newest
        stale = now - self.window_s
        best, best_n = None, share
        if guarded:
            for sender in self.useful:
                seqs = newest.get(sender)
                if seqs is None or sender == node_id:
                    continue
                n = served[sender] if sender in served else 0
                if n < best_n and (e := self._newest_unsent(seqs, rid, stale, entries)) is not None:
                    best, best_n = e, n
            if best is not None or self.probation_sent >= self.probation:
                return best
            best_n = 1                                # probation: one each
        looked = 0
        for sender in reversed(newest):
            seqs = newest[sender]
            last = entries.get(seqs[-1])
            if last is None or last.t < stale:        # activity order: every later one is older
                break
            if sender == node_id or (guarded and sender in self.useful):   # never your own
                continue
            looked += 1
            if looked > max(8 * self.k, 32):
                break
            n = served[sender] if sender in served else 0
            if n >= best_n:
                continue
            e = self._newest_unsent(seqs, rid, stale, entries)
            if e is not None:
                best, best_n = e, n
                if n == 0:
                    break
        return best
