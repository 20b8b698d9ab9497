"""The STATS reply: what `Relay.stats` says, encoded once for many askers and cut to the room
its asker has (relay.queued: a reply is queued bytes like a rollout).

Building STATS is O(peers); 300 connections asking at the allowed 2/s each made the relay
spend its time on them (2 publishes accepted in 115 s, issue 62.1). So the encoded parts are
kept while they are younger than 20 times what building them took (STATS then costs at most
about 5 % of the relay's time), never longer than a second. The peer list is cut to the
room: under pressure an asker is told fewer peers (`peers_shown` of `peers_total`), not
nothing."""
from __future__ import annotations

import time
from typing import Callable

import orjson

REUSE_FACTOR, REUSE_MAX_S = 20, 1.0


class StatsReply:
    """`build()` returns (the stats without "peers", the peers' entries): encoded once while fresh."""

    def __init__(self, build: Callable[[], tuple[dict, list[dict]]]):
        self.build = build
        self._parts: tuple[bytes, list[bytes]] | None = None
        self._until = 0.0

    def parts(self, now: float | None = None) -> tuple[bytes, list[bytes]]:
        now = time.monotonic() if now is None else now
        if self._parts is None or now >= self._until:
            t0 = time.perf_counter()
            head, peers = self.build()
            self._parts = (orjson.dumps(head), [orjson.dumps(p) for p in peers])
            took = time.perf_counter() - t0
            self._until = now + min(REUSE_MAX_S, REUSE_FACTOR * took)
        return self._parts

    def reply(self, room: int, now: float | None = None) -> bytes | None:
        """The STATS JSON in at most `room` bytes, with as many peers as fit (in the order
        the relay keeps them: the longest connected first); None when not even the rest fits."""
        head, peers = self.parts(now)
        return assemble(head, peers, room)


def assemble(head: bytes, peers: list[bytes], room: int) -> bytes | None:
    """{"peers_shown": k, "peers_total": n, "peers": [the first k], ...head} within room bytes."""
    fixed = len(head) + 64                   # the keys and counts around the list
    if fixed > room:
        return None
    used, k = fixed, 0
    for p in peers:
        if used + len(p) + 1 > room:
            break
        used += len(p) + 1
        k += 1
    return (b'{"peers_shown":%d,"peers_total":%d,"peers":[' % (k, len(peers)) + b",".join(peers[:k])
            + b"]" + (b"," + head[1:] if len(head) > 2 else b"}"))
