"""A loopback TCP port nobody listens on right now, for a relay started on this machine (the demo,
the experiments, the benchmarks and the tests all start theirs on one)."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS just handed out and let go: free now (another process may take it before the
    relay binds it, which the relay then reports as a bind error)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
