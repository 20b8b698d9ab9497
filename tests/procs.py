"""Real processes for tests: a relay on a loopback port, found free at run time."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from relay.cli import query_stats
from relay.keys import ClientKeys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RelayProc:
    """A real `python -m relay` process on a loopback port."""

    def __init__(self, *args: str, port: int | None = None, log_level: str = "WARNING"):
        self.log_level = log_level
        self.port = port or free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.args = args
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relay", "--bind", self.address, "--log-level", self.log_level, *self.args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stats(self, keys: ClientKeys | None = None) -> dict:
        return query_stats(self.address, keys, timeout_s=2.0)

    def wait_ready(self, keys: ClientKeys | None = None) -> None:
        deadline = time.time() + 10
        while time.time() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                self.stats(keys)
                return
            except TimeoutError:
                time.sleep(0.05)
        raise TimeoutError("relay did not come up")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode
