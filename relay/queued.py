"""What the relay holds for its clients: rollout bytes handed to ZeroMQ and not proven read
(docs/relay.md, "Holding the relay's memory by not reading"). The rules only: no socket, and
the time is always given (`now`), so they are tested with a made-up clock.

The proof is a MARK: a random nonce sent in the client's own pipe after its deliveries; a
PING that echoes it shows everything sent before it was read. A client that does not read
cannot know the nonce, so nothing it claims raises its room.

- Room: a connection may hold up to its own cap (an empty queue always takes one rollout);
  all connections together up to the total cap, and past it each only its share (total cap /
  subscribers) — never past twice the total cap, however the connections came and went, and
  the last half cap of that only for connections that ever echoed a MARK (the relay sends one
  to a connection refused room before it did, even with nothing queued), each of them getting
  at least an equal part of it: however many non-readers fill the rest, a reader keeps its
  share.
- Replies (every message that is not a rollout: WELCOME, SUBOK, ACK, NACK, PONG, STATS,
  MARK) are queued bytes too, in the same account and total. A reply may take a connection a
  quarter past its own cap (`reply_room`), and the total up to the rollouts' ceiling (1.5 or
  2 x the total cap) plus a band of an eighth of the cap; past that each connection still
  gets its part of the band (band / connections, at least `REPLY_SMALL`: a fresh one's
  WELCOME, SUBOK, PONG and first MARK), so however many connections ask and never read, one
  that reads is answered. A connection whose reply does not fit is over its cap: the relay
  sheds it as it sheds a non-reader (a ghost, cut), or, if it proved it reads and only the
  total is full, skips that reply. So the total never passes 2 x the cap + 2 bands
  (2.25 x at the defaults' 10,000 peers or fewer).
- Ghosts: a connection dropped (BYE, silence, or holding bytes with no proof of reading for
  `stuck_s`) may still be open, its pipe still full: its bytes stay counted until the relay
  knows the connection is gone. The relay cuts such a connection (`Queued.drop` says to), so a
  ghost lasts about one housekeeping turn; the same connection saying HELLO again meanwhile
  inherits its account instead of a fresh one."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field


REPLY_SMALL = 2048             # replies any connection may hold whatever the total (see the docstring)
FRAME_COST = 64               # what ZeroMQ keeps per queued frame besides its bytes (a zmq_msg_t)


def reply_bytes(frames) -> int:
    """What a reply of these frames holds in the relay's memory until it is read."""
    return sum(len(f) for f in frames) + FRAME_COST * len(frames)


@dataclass(slots=True)
class Account:
    """One connection's queued bytes: `out` handed to ZeroMQ, `drained` proven read."""

    out: int = 0
    drained: int = 0
    marks: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))  # (nonce, out)
    marked_at: int = 0            # `out` when the last MARK was sent
    proven_at: float = 0.0        # when it last proved a read or owed nothing
    held_back: str = ""           # why its deliveries wait ("own cap", "total cap"), "" when they do not
    proven: bool = False          # it echoed a MARK: it reads

    @property
    def queued(self) -> int:
        return self.out - self.drained


class Queued:
    """Every connection's account, the ghosts', and their total (the relay's own count, never a
    client's claim). `subscribers` and `readers` (those that echoed a MARK) are set by the relay
    once per loop turn: the shares' divisors."""

    def __init__(self, peer_cap: int, total_cap: int, max_message: int, stuck_s: float):
        self.peer_cap, self.total_cap, self.max_message = peer_cap, total_cap, max_message
        self.stuck_s = stuck_s
        self.accounts: dict[bytes, Account] = {}
        self.ghosts: collections.OrderedDict[bytes, Account] = collections.OrderedDict()
        self.total = 0
        self.subscribers = self.readers = 1

    def open(self, rid: bytes, now: float) -> Account:
        """The connection's account: its own, a ghost's (the same connection again: its pipe
        still holds what it held), or a new one."""
        a = self.accounts.get(rid)
        if a is None:
            a = self.ghosts.pop(rid, None)
            if a is None:
                a = Account(proven_at=now)
            a.marked_at = a.out         # its old MARKs stay valid receipts
            self.accounts[rid] = a
        return a

    def room(self, a: Account) -> int:
        """Rollout bytes it may be sent now (see the module docstring)."""
        cap, total_cap = self.peer_cap, self.total_cap
        q = a.queued
        own = (1 << 62) if not cap else max(cap, self.max_message) if q <= 0 else cap - q
        if not total_cap:
            return own
        below = total_cap - self.total
        share = total_cap // max(1, self.subscribers)
        if a.proven:                 # the last half cap is the readers': shared among them alone
            share, ceiling = max(share, total_cap // 2 // max(1, self.readers)), 2 * total_cap
        else:
            ceiling = 3 * total_cap // 2
        share = min(share - q, ceiling - self.total)
        pool = max(below, share)
        if pool < own:
            a.held_back = "total cap"
            return pool
        a.held_back = "own cap"          # (shown only while it is refused for room)
        return own

    def reply_room(self, a: Account) -> int:
        """Reply bytes it may be sent now (see the module docstring): negative or too small
        for the reply means it is over its cap."""
        cap, total_cap = self.peer_cap, self.total_cap
        q = a.queued
        own = (1 << 62) if not cap else max(cap + cap // 4, REPLY_SMALL) - q
        if not total_cap:
            return own
        band = total_cap // 8
        ceiling = (2 * total_cap if a.proven else 3 * total_cap // 2) + band
        part = max(REPLY_SMALL, band // max(1, len(self.accounts)))
        return min(own, max(ceiling - self.total, part - q))

    def sent(self, a: Account, nbytes: int, now: float) -> None:
        if a.queued <= 0:
            a.proven_at = now           # it owed nothing until now
        a.out += nbytes
        self.total += nbytes

    def mark_due(self, a: Account, force: bool = False) -> bool:
        """A MARK is due when a quarter of its cap (or, when `force`, anything) went out
        unmarked since the last one."""
        unmarked = a.out - a.marked_at
        return unmarked > 0 and (force or unmarked >= max(1, self.peer_cap // 4))

    def opening_mark_due(self, a: Account) -> bool:
        """A MARK even with nothing unmarked, so a client refused room before it ever echoed
        one can prove it reads."""
        return not a.proven and not a.marks

    def marked(self, a: Account, nonce: bytes) -> None:
        """A MARK with this nonce went into its pipe after everything sent so far."""
        a.marks.append((nonce, a.out))
        a.marked_at = a.out

    def receipt(self, a: Account, nonce: bytes, now: float) -> bool:
        """A PING echoed a MARK: what was sent before it is read. False for a nonce it was
        never sent (a guess, a replay, a MARK older than the 64 it remembers)."""
        for i, (n, pos) in enumerate(a.marks):
            if n == nonce:
                a.proven = True
                for _ in range(i + 1):
                    a.marks.popleft()
                if pos > a.drained:
                    self.total -= pos - a.drained
                    a.drained = pos
                    a.proven_at = now
                if a.queued <= 0:
                    a.held_back = ""
                return True
        return False

    def stuck(self, now: float) -> list[bytes]:
        """Live connections holding bytes that proved no read for `stuck_s`: non-readers, to
        be dropped and cut like a silent client."""
        limit = now - self.stuck_s
        return [rid for rid, a in self.accounts.items() if a.queued > 0 and a.proven_at < limit]

    def drop(self, rid: bytes, gone: bool) -> bool:
        """A connection's client is forgotten. Unless its connection is known `gone`, what is
        queued for it stays counted as a ghost: True when so (the relay should cut it)."""
        if gone:
            self.gone(rid)
            return False
        a = self.accounts.pop(rid, None)
        if a is None or a.queued <= 0:
            return False
        self.ghosts[rid] = a
        return True

    def gone(self, rid: bytes) -> None:
        """Its connection is gone (a send found no route): its pipe, and its bytes, with it."""
        a = self.ghosts.pop(rid, None) or self.accounts.pop(rid, None)
        if a is not None:
            self.total -= a.queued

    def ghost_bytes(self) -> int:
        return sum(a.queued for a in self.ghosts.values())
