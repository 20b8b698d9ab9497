"""The tests' one harness for real processes: a relay on a loopback port found free at run time,
a node started from a tiny node file, the `ftis-edge` command line, and waiting for something
that must happen (a hang guard, never a timing)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ftis_edge.metrics.records import read_rounds as rounds_of  # noqa: F401  (the tests take these from here)
from ftis_edge.common.ports import free_port  # noqa: F401
from relay.cli import query_stats
from relay.keys import ClientKeys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for(cond, timeout_s: float = 10.0, every_s: float = 0.05) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout_s`` passed (then its last answer): the
    caller asserts it, so a broken component fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return bool(cond())


def wait_connected(*clients, timeout_s: float = 10.0) -> None:
    """Relay clients (``RelayClient``, ``SwarmClient``) all connected to their relay."""
    assert wait_for(lambda: all(c.stats()["connected"] for c in clients), timeout_s), [c.stats() for c in clients]


def fence(publisher, *receivers, timeout_s: float = 10.0, **tags) -> list[list]:
    """Publish a marker rollout and poll each receiver until the marker arrives: the relay
    delivers a topic to a subscriber in publish order, so all that was published before the
    marker has arrived by then (the event a fixed sleep before "nothing more arrives" stood for).
    Returns what each receiver polled before the marker. ``tags``: the marker's task/tok (to
    pass the receivers' filters). Not for budgeted subscriptions (they choose, not in order)."""
    from ftis_edge.peers.swarm import SwarmClient
    from messages import make_rollout, raw_rollout
    rid = f"fence-{os.urandom(6).hex()}"
    if isinstance(publisher, SwarmClient):
        publisher.publish(make_rollout(publisher.node_id, n=1, tokens=4, rollout_id=rid, **tags))
    else:
        publisher.publish_bytes(raw_rollout(rid, **tags), **tags)
    got: list[list] = [[] for _ in receivers]
    seen = [False] * len(receivers)

    def arrived() -> bool:
        for i, r in enumerate(receivers):
            for item in r.poll():
                if item.rollout_id == rid or (getattr(item, "rollout", None) and item.rollout.rollout_id == rid):
                    seen[i] = True
                else:
                    got[i].append(item)
        return all(seen)
    assert wait_for(arrived, timeout_s, every_s=0.01), f"the fence {rid} did not reach every receiver"
    return got


def subscribed(relay: "RelayProc", *node_ids: str, keys: ClientKeys | None = None, timeout_s: float = 10.0) -> bool:
    """Each named node's SUB has reached the relay (it holds a cursor on a topic there)."""
    return wait_for(lambda: {p["node_id"] for p in relay.stats(keys)["peers"] if p["topics"]} >= set(node_ids),
                    timeout_s)


def settled(relay: "RelayProc", *clients, keys: ClientKeys | None = None, timeout_s: float = 10.0) -> bool:
    """The relay has nothing left to send these clients (no lag) and each has taken in every
    byte the relay sent it: the event a fixed sleep before "nothing more arrives" stood for,
    seen without publishing anything (their counters stay the test's)."""
    def done() -> bool:
        peers = {p["node_id"]: p for p in relay.stats(keys)["peers"]}
        return all(c.node_id in peers and peers[c.node_id]["lag"] == 0
                   and peers[c.node_id]["out_bytes"] == c.stats()["bytes_in"] for c in clients)
    return wait_for(done, timeout_s)


def cli(*args: str, cwd=ROOT, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m ftis_edge.cli ARGS`` as a user runs it: exit code, stdout and stderr as text."""
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


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


# --- a real node -------------------------------------------------------------------------------

# Small enough for 2 CPU cores, large enough that groups have mixed rewards (shaped reward).
TINY = {
    "task": {"prompts_per_round": 2, "num_generations": 4, "max_completion_length": 40, "reward": "shaped"},
    "model": {"threads": 1},
    "train": {"micro_batch": 8},
    "eval": {"prompts": 4},      # the held-out eval runs on every node start (round 0 and the end), cheaply
}


def write_config(folder: Path, node_id: str, *, name: str | None = None, **sections) -> Path:
    """``folder/<name>.toml``: TINY with ``sections`` merged in; the run goes to ``folder/<name>``
    (``name`` defaults to the node id: the node id is part of every sampling seed, so two runs
    that must match share it and differ in ``name``)."""
    from ftis_edge import config
    name = name or node_id
    merged: dict = {s: dict(v) for s, v in TINY.items()}
    for s, v in sections.items():
        merged.setdefault(s, {}).update(v)
    merged.setdefault("node", {}).update({"id": node_id, "run_dir": str(Path(folder) / name)})
    path = Path(folder) / f"{name}.toml"
    path.write_text(config.to_toml(config.from_dict(merged), comments=False))
    return path


def start_node(cfg: Path, *args: str) -> subprocess.Popen:
    """``ftis-edge start CFG --headless ARGS`` in the background, its output in one pipe."""
    return subprocess.Popen([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg), "--headless", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_dashboard(cfg: Path) -> tuple[subprocess.Popen, int]:
    """``ftis-edge start CFG`` in a real terminal (a pty, 120x40), as a user starts the dashboard:
    (the process, the terminal's master fd for the caller to close). Its output is drained in a
    thread: the app blocks when nobody reads its terminal."""
    import fcntl
    import pty
    import struct
    import termios
    import threading
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg)], cwd=ROOT,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env=dict(os.environ, TERM="xterm-256color"))
    os.close(slave)

    def drain():
        try:
            while os.read(master, 65536):
                pass
        except OSError:
            pass
    threading.Thread(target=drain, daemon=True).start()
    return proc, master


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    """A started node to its end: its output; the test fails (with the output's tail) unless it exits 0."""
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def run_node(cfg: Path, *args: str, timeout: float = 900) -> str:
    return finish(start_node(cfg, *args), timeout)


@contextmanager
def running(*procs: subprocess.Popen, relay: RelayProc | None = None):
    """Whatever is still running when the block ends (a failed assertion, say) is killed: a test
    never leaves a node or a relay behind."""
    try:
        yield
    finally:
        for p in (*procs, *([relay.proc] if relay is not None else [])):
            if p.poll() is None:
                p.kill()
                p.wait()


def finish_all(*procs: subprocess.Popen, relay: RelayProc | None = None, timeout: float = 600) -> list[str]:
    """Every node to its end (their outputs), then the relay stopped."""
    with running(*procs, relay=relay):
        outs = [finish(p, timeout) for p in procs]
        if relay is not None:
            relay.stop()
    return outs


# The commands that read a run directory someone else may have written (attacks aim at these).
RUN_DIR_COMMANDS = ("export", "start --resume", "eval --model")


def run_dir_command(command: str, run: Path) -> tuple[str, ...]:
    """The `ftis-edge` arguments of one of RUN_DIR_COMMANDS on ``run``, with the cheapest settings."""
    return {"export": ("export", str(run), "--eval-limit", "0"),
            "start --resume": ("start", str(Path(run) / "config.toml"), "--headless", "--resume"),
            "eval --model": ("eval", "--model", str(run), "--task", "arith", "--limit", "1")}[command]


def run_node_watching(cfg: Path, run_dir: Path, timeout: float = 900) -> tuple[str, list[str]]:
    """Run a node to its end while reading its ``progress.json`` every 20 ms: (its output, the
    phases it announced, in order, each once per stretch)."""
    from ftis_edge.store import progress
    proc = start_node(cfg)
    seen: list[str] = []
    with running(proc):
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            got = progress.read_progress(run_dir)
            if got and (not seen or seen[-1] != got["phase"]):
                seen.append(got["phase"])
            time.sleep(0.02)
        return finish(proc, 60), seen
