"""Delivery budgets: a subscriber's K rollouts per window, shared fairly across publishers,
newest first (docs/relay.md, "Delivery budgets"). The rules only: no socket, and the time is
always given (`now`), so they are tested with a made-up clock.

Sybil resistance (many fake ids must not crowd out a useful publisher): a subscriber names the publishers it found useful (USEFUL, the
node: those whose groups it trained on). While one of them is active, the useful publishers
share the budget but a probation slice, and every other id (fresh, unknown: what a crowd of
fake identities is) shares only that slice, one rollout each, so no number of fresh ids can
spend what an honest, useful publisher would get. With no useful publisher active, every
publisher gets the plain fair share (a node that has trained on nobody yet).

Among publishers that may be picked, the one that has waited longest goes first: each has a
turn (when it was last served, or first seen), so ids that came first, however many, are
served in rotation and a publisher that arrives after them is served within about
(active publishers / K) windows, instead of never (newest-first let a crowd that keeps
publishing stay ahead of it for ever, so it was never picked, never trained on, never useful)."""
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
    turns: dict = field(default_factory=dict)       # sender -> its place in the rotation (lower: sooner)
    turn: int = 0                                   # deliveries made so far: the rotation's clock

    def window_over(self, now: float) -> bool:
        return now - self.window_start >= self.window_s

    def new_window(self, now: float, entries: dict) -> None:
        """Budget and shares reset; sent seqs are remembered only while still fresh."""
        self.window_start, self.sent, self.pick_at, self.probation_sent = now, 0, 0.0, 0
        self.served.clear()
        if self.index is not None and len(self.turns) > len(self.index.newest):   # forget the gone
            self.turns = {s: t for s, t in self.turns.items() if s in self.index.newest}
        stale = now - self.window_s
        self.sent_seqs = {s for s in self.sent_seqs if (e := entries.get(s)) is not None and e.t >= stale}

    def record(self, e: Entry) -> None:
        """One delivery made from this budget."""
        self.sent_seqs.add(e.seq)
        self.served[e.sender] += 1
        self.turn += 1
        self.turns[e.sender] = self.turn         # to the back of the rotation
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
        publisher never served this window; unguarded, the least served one below `share`.
        Among equals, the one whose turn came longest ago (see the module docstring). None
        when no publisher has a candidate. The activity scan looks at most max(64K, 256)
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
