"""Rate limits: token buckets per connection and per node id, and the relay's global accept
budget shared per source. Pure bookkeeping: no socket, and every call is given the time
(`now`), so the rules are tested with a made-up clock."""
from __future__ import annotations

import collections
import math


class TokenBucket:
    """rate tokens/s, up to burst; rate 0 means unlimited."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float, now: float = 0.0):
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, now

    def refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.t) * self.rate)
        self.t = now

    def take(self, n: float, now: float) -> bool:
        if self.rate <= 0:
            return True
        self.refill(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class RateLimits:
    """A (messages, bytes) bucket pair per key (b"c" + routing id, b"n" + node id), the
    oldest forgotten past max_keys so a flood of identities cannot grow it without bound."""

    def __init__(self, rate_msgs: float, burst_msgs: float, rate_bytes: float, burst_bytes: float,
                 max_keys: int):
        self.rate_msgs, self.burst_msgs = rate_msgs, burst_msgs
        self.rate_bytes, self.burst_bytes = rate_bytes, burst_bytes
        self.max_keys = max_keys
        self.buckets: collections.OrderedDict[bytes, tuple[TokenBucket, TokenBucket]] = collections.OrderedDict()

    def allow(self, key: bytes, nbytes: int, now: float) -> bool:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = (TokenBucket(self.rate_msgs, self.burst_msgs, now),
                                     TokenBucket(self.rate_bytes, self.burst_bytes, now))
            if len(self.buckets) > self.max_keys:
                self.buckets.popitem(last=False)
        msgs, size = b
        return msgs.take(1.0, now) and size.take(nbytes, now)

    def forget(self, key: bytes) -> None:
        self.buckets.pop(key, None)


class AcceptBudget:
    """The global accept budget (rollouts/s for all publishers together), shared per source.

    While the global bucket has tokens, everyone is accepted. When it is empty (overload), a
    source (a connection, or a key on CURVE) is still accepted while its own recent rate is
    below its fair share, rate / active sources: overload is shed from those who cause it,
    and a publisher within its share is never `busy` because of the others. Accepting a
    source within its share may drive the bucket below zero (down to -burst); that debt is
    paid by the sources above their share, which are refused until it is.

    A source's rate is an exponential moving average over tau_s; a source is active while
    it asked within tau_s (refused attempts count: a flooder is a source that wants)."""

    def __init__(self, rate: float, burst: float, tau_s: float = 2.0, max_sources: int = 40_000):
        self.bucket = TokenBucket(rate, burst)
        self.rate, self.burst, self.tau_s, self.max_sources = rate, burst, tau_s, max_sources
        self.sources: collections.OrderedDict[bytes, list] = collections.OrderedDict()   # key -> [rate, t]
        self._active = (-1.0, 0)          # (computed at, count): counted at most every 0.1 s

    def _rate(self, src: list, now: float) -> float:
        r, t = src
        return r * math.exp(-max(0.0, now - t) / self.tau_s)

    def active(self, now: float) -> int:
        at, n = self._active
        if now - at > 0.1:
            n = 0
            for src in reversed(self.sources.values()):      # most recent askers at the end
                if now - src[1] > self.tau_s:
                    break
                n += 1
            self._active = (now, n)
        return n

    def fair_share(self, now: float) -> float:
        return self.rate / max(1, self.active(now))

    def within_share(self, key: bytes, now: float) -> bool:
        """The source's recent accept rate is below its fair share (False when unlimited:
        there is no share to be within)."""
        return self.rate > 0 and self.source_rate(key, now) < self.fair_share(now)

    def source_rate(self, key: bytes, now: float) -> float:
        src = self.sources.get(key)
        return 0.0 if src is None else self._rate(src, now)

    def admit(self, key: bytes, now: float) -> bool:
        """One rollout from source `key`: True when accepted (and charged)."""
        if self.rate <= 0:
            return True
        src = self.sources.pop(key, None)
        if src is None:
            src = [0.0, now]
            if len(self.sources) >= self.max_sources:
                self.sources.popitem(last=False)
        src[0] = self._rate(src, now)
        src[1] = now
        self.sources[key] = src                   # the end: most recent asker
        ok = self.bucket.take(1.0, now)
        if not ok and src[0] < self.fair_share(now):
            self.bucket.tokens = max(-self.burst, self.bucket.tokens - 1.0)   # within its share: debt
            ok = True
        if ok:
            src[0] += 1.0 / self.tau_s
        return ok

    def forget(self, key: bytes) -> None:
        self.sources.pop(key, None)
