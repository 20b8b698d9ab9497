"""A topic's data: accepted rollouts (entries) in a bounded replay buffer, and the candidate
indexes that budgeted subscribers pick from. Pure data structures: no socket, no clock (every
method that needs the time is given `now`)."""
from __future__ import annotations

import collections
from dataclasses import dataclass

from relay import protocol as P

SENDER_HISTORY = 64           # seqs an index keeps per publisher (newest unsent is picked among them)
SOURCE_HISTORY = 256          # newest publishers an index keeps per source (where newcomers are looked for)
MAX_SOURCES = 4096            # sources an index keeps (the ones with the latest arrival)


@dataclass(slots=True)
class Entry:
    seq: int
    rollout_id: bytes
    sender_rid: bytes
    sender: bytes          # node id
    size: int              # payload bytes
    body: bytes            # the DELIVER frame (metadata + payload), built once for all subscribers
    t: float               # accepted at (monotonic)
    task: str | None
    tok: str | None
    source: bytes = b""    # where its publisher connects from (address or CURVE key; relay.budget)


def passes(filters: dict | None, e: Entry) -> bool:
    """A subscriber's filters ({"task": set, "tok": set}, None = everything). Since rollout
    protocol 3 every rollout's tags are read from its prefix (an empty tag is a tag like any
    other, it does not slip through a filter); None only where no tag is known."""
    return filters is None or not ((e.task is not None and "task" in filters and e.task not in filters["task"])
                                   or (e.tok is not None and "tok" in filters and e.tok not in filters["tok"]))


class Index:
    """Per topic and filter set: every publisher's newest rollouts (that pass the filters), in
    order of its latest activity. Budgeted subscribers with the same filters share one, so a
    new rollout costs O(indexes + hungry subscribers), not O(all subscribers)."""

    __slots__ = ("filters", "newest", "subs", "hungry", "_active", "sources", "arrivals")

    def __init__(self, filters: dict | None):
        self.filters = filters
        self.newest: collections.OrderedDict[bytes, collections.deque] = collections.OrderedDict()
        # per source, its publishers in order of arrival, (arrival number, sender), the source
        # with the latest arrival last: budgets find newcomers here without scanning a crowd
        self.sources: collections.OrderedDict[bytes, collections.deque] = collections.OrderedDict()
        self.arrivals = 0
        self.subs: set[bytes] = set()         # budgeted subscribers using it
        self.hungry: set[bytes] = set()       # ... of which have budget left this window
        self._active = (0.0, 0.0, 0)          # (computed at, window, count) cache

    @staticmethod
    def key(filters: dict | None) -> tuple:
        return tuple(sorted((k, tuple(sorted(v))) for k, v in (filters or {}).items()))

    def matches(self, e: Entry) -> bool:
        return passes(self.filters, e)

    def active_senders(self, now: float, window_s: float, entries: dict) -> int:
        """Publishers of rollouts that pass these filters heard from within window_s (cached
        for 0.5 s: asked once per pump; activity order lets the count stop at the first stale)."""
        at, w, n = self._active
        if now - at > 0.5 or w != window_s:
            n = 0
            for seqs in reversed(self.newest.values()):
                e = entries.get(seqs[-1])
                if e is None or now - e.t > window_s:
                    break
                n += 1
            self._active = (now, window_s, n)
        return n

    def is_active(self, sender: bytes, now: float, window_s: float, entries: dict) -> bool:
        seqs = self.newest.get(sender)
        e = entries.get(seqs[-1]) if seqs else None
        return e is not None and now - e.t <= window_s

    def add(self, e: Entry, first_seq: int) -> None:
        seqs = self.newest.pop(e.sender, None)
        if seqs is None:
            seqs = collections.deque(maxlen=SENDER_HISTORY)
            self.arrivals += 1
            src = self.sources.pop(e.source, None)
            if src is None:
                src = collections.deque(maxlen=SOURCE_HISTORY)
                if len(self.sources) >= MAX_SOURCES:
                    self.sources.popitem(last=False)
            src.append((self.arrivals, e.sender))
            self.sources[e.source] = src
        seqs.append(e.seq)
        self.newest[e.sender] = seqs            # the end: most recently active
        newest = self.newest
        while newest:                           # publishers whose newest left the buffer
            first = next(iter(newest.values()))
            if first[-1] >= first_seq:
                break
            newest.popitem(last=False)


class Topic:
    """Sequence numbers and a bounded replay buffer (by count and by bytes)."""

    def __init__(self, name: bytes, max_count: int, max_bytes: int, epoch: bytes):
        self.name, self.epoch = name, epoch
        self.entries: dict[int, Entry] = {}
        self.first_seq = 1
        self.next_seq = 1
        self.nbytes = 0
        self.max_count, self.max_bytes = max_count, max_bytes
        self.subscribers: set[bytes] = set()
        self.full_subs: set[bytes] = set()        # ... of which subscribe to everything (cursor pumps)
        self.indexes: dict[tuple, Index] = {}     # budgeted subscribers' candidates, one per filter set
        self.hold_seq: int | None = None          # lowest cursor of subscribers that hold the buffer

    def room_for(self, size: int, reserve: bool = False) -> bool:
        """True when appending `size` bytes evicts nothing a holding subscriber still needs.

        reserve: the buffer may grow past its bounds by a sixteenth (count and bytes) for
        this one, rather than evict what is held (quiet publishers under a flood)."""
        count, nbytes, first, hold = len(self.entries), self.nbytes, self.first_seq, self.hold_seq
        while count and (count + 1 > self.max_count or nbytes + size > self.max_bytes) \
                and (hold is None or first < hold):
            nbytes -= self.entries[first].size
            first += 1
            count -= 1
        if not count:
            return True
        max_count, max_bytes = self.max_count, self.max_bytes
        if reserve:
            max_count += max(1, max_count // 16)
            max_bytes += max(size, max_bytes // 16)
        return count + 1 <= max_count and nbytes + size <= max_bytes

    def append(self, e_rid: bytes, sender_rid: bytes, sender: bytes, payload: bytes, attrs: bytes,
               task: str | None, tok: str | None, now: float, source: bytes = b"") -> Entry:
        """Add an accepted rollout (evicting the oldest past the bounds) and offer it to the
        indexes whose filters it passes; returns the entry."""
        seq = self.next_seq
        e = self.entries[seq] = Entry(seq, e_rid, sender_rid, sender, len(payload),
                                      P.pack_deliver(seq, self.name, self.epoch, sender, e_rid, attrs, payload),
                                      now, task, tok, source)
        self.next_seq += 1
        self.nbytes += len(payload)
        self.trim()
        return e

    def trim(self) -> None:
        """Evict the oldest while past a bound, but nothing held (the buffer may be past a
        bound by the reserve until the holders have what it holds)."""
        hold = self.hold_seq
        while self.entries and (len(self.entries) > self.max_count or self.nbytes > self.max_bytes) \
                and (hold is None or self.first_seq < hold):
            old = self.entries.pop(self.first_seq)
            self.nbytes -= old.size
            self.first_seq += 1

    def index_for(self, filters: dict | None) -> Index:
        """The candidate index shared by every budgeted subscriber with these filters (built
        from the replay buffer when the first one subscribes)."""
        key = Index.key(filters)
        idx = self.indexes.get(key)
        if idx is None:
            idx = self.indexes[key] = Index(filters)
            for seq in range(self.first_seq, self.next_seq):
                e = self.entries[seq]
                if idx.matches(e):
                    idx.add(e, self.first_seq)
        return idx

    def index_new(self, e: Entry) -> list[tuple]:
        """Add a new entry to every index it matches; the keys of those with hungry subscribers."""
        dirty = []
        for key, idx in self.indexes.items():
            if idx.matches(e):
                idx.add(e, self.first_seq)
                if idx.hungry:
                    dirty.append(key)
        return dirty
