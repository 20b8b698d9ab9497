"""Repeated log lines, at most one per key per interval: a node with a wrong server key retries
its handshake about ten times a second, and each refusal was a line (746 in 70 s, issue 63.6).
The first line for a key is written; then at most one per `every_s`, saying how many like it
were held back. Pure bookkeeping (the time is given), thread-safe (ZAP runs in its own thread)."""
from __future__ import annotations

import collections
import threading


class LineLimit:
    def __init__(self, every_s: float = 10.0, max_keys: int = 1024):
        self.every_s, self.max_keys = every_s, max_keys
        self._seen: collections.OrderedDict[object, list] = collections.OrderedDict()   # key -> [last, held]
        self._lock = threading.Lock()

    def check(self, key, now: float) -> int | None:
        """None: hold this line back. Else write it, with this many like it held back since
        the last one written (0 for the first)."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = [now, 0]
                if len(self._seen) > self.max_keys:
                    self._seen.popitem(last=False)
                return 0
            if now - seen[0] < self.every_s:
                seen[1] += 1
                return None
            held, seen[0], seen[1] = seen[1], now, 0
            self._seen.move_to_end(key)
            return held

    def held(self) -> int:
        """Lines held back and not yet reported by a later line (for the stop line)."""
        with self._lock:
            return sum(s[1] for s in self._seen.values())


def more(held: int, every_s: float) -> str:
    """The suffix of a line written after `held` like it were held back."""
    return f" (and {held} more like it in the last {every_s:.0f} s)" if held else ""
