"""Delivery budgets: a subscriber's K rollouts per window, shared fairly across publishers,
newest first (docs/relay.md, "Delivery budgets"). The rules only: no socket, and the time is
always given (`now`), so they are tested with a made-up clock."""
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

    def window_over(self, now: float) -> bool:
        return now - self.window_start >= self.window_s

    def new_window(self, now: float, entries: dict) -> None:
        """Budget and shares reset; sent seqs are remembered only while still fresh."""
        self.window_start, self.sent, self.pick_at = now, 0, 0.0
        self.served.clear()
        stale = now - self.window_s
        self.sent_seqs = {s for s in self.sent_seqs if (e := entries.get(s)) is not None and e.t >= stale}

    def record(self, e: Entry) -> None:
        """One delivery made from this budget."""
        self.sent_seqs.add(e.seq)
        self.served[e.sender] += 1
        self.sent += 1

    def fair_share(self, node_id: bytes, now: float, entries: dict) -> int:
        """k / active publishers, rounded up: the publishers this subscriber can be offered
        (those whose rollouts pass its filters), not counting itself (its own rollouts are
        never offered to it)."""
        active = self.index.active_senders(now, self.window_s, entries)
        active -= self.index.is_active(node_id, now, self.window_s, entries)
        return max(1, -(-self.k // max(1, active)))

    def pick(self, node_id: bytes, rid: bytes, now: float, entries: dict, share: int) -> Entry | None:
        """The next pick for subscriber (node_id, routing id rid): newest activity first, the
        first publisher never served this window, else the least served one below `share`;
        None when no publisher has a candidate. Looks at most max(8K, 32) publishers (picks
        take the most recently active first)."""
        sent, served = self.sent_seqs, self.served
        stale, start = now - self.window_s, self.start_seq
        best, best_n, looked = None, share, 0
        newest = self.index.newest
        for sender in reversed(newest):
            seqs = newest[sender]
            last = entries.get(seqs[-1])
            if last is None or last.t < stale:        # activity order: every later one is older
                break
            if sender == node_id:                     # never your own
                continue
            looked += 1
            if looked > max(8 * self.k, 32):
                break
            n = served[sender] if sender in served else 0
            if n >= best_n:
                continue
            for s in reversed(seqs):                  # its newest rollout not yet sent to this one
                if s < start:
                    break
                if s in sent:
                    continue
                e = entries.get(s)
                if e is None or e.t < stale:
                    break
                if e.sender_rid == rid:               # a bridge: not back to where it came from
                    continue
                best, best_n = e, n
                break
            if best is not None and best_n == 0:
                break
        return best
