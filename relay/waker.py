"""Wake a thread blocked in ``zmq.Poller.poll`` from any other thread.

POSIX: a non-blocking pipe. Windows: ``zmq.Poller`` polls only sockets there (a pipe's fd is
not one), so a connected socket pair is used instead. Both sides are fire-and-forget: a full
buffer means the poller is awake anyway.
"""
from __future__ import annotations

import os
import socket


class Waker:
    def __init__(self) -> None:
        self._closed = False
        if os.name == "nt":
            self._r, self._w = socket.socketpair()
            self._r.setblocking(False)
            self._w.setblocking(False)
        else:
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)

    def fileno(self) -> int:
        """What to register with ``zmq.Poller`` (POLLIN)."""
        return self._r if isinstance(self._r, int) else self._r.fileno()

    @property
    def closed(self) -> bool:
        return self._closed

    def wake(self) -> None:
        try:
            if isinstance(self._w, int):
                os.write(self._w, b"x")
            else:
                self._w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass

    def drain(self) -> None:
        try:
            if isinstance(self._r, int):
                os.read(self._r, 65536)
            else:
                self._r.recv(65536)
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for end in (self._r, self._w):
            try:
                os.close(end) if isinstance(end, int) else end.close()
            except OSError:
                pass
