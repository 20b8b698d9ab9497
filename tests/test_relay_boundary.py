"""The relay's boundary and its command line: it runs on pyzmq + orjson alone, never loading the
node, its codec, numpy or torch; `ftis-relay --help` explains itself; SIGTERM stops it in every
state within a second or two."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
import zmq

from relay import protocol as P
from messages import raw_rollout
from procs import ROOT, RelayProc, free_port, wait_connected, wait_for

pytestmark = pytest.mark.timeout(60)
FORBIDDEN = ("ftis_edge", "torch", "numpy", "transformers", "llama_cpp")


def _relay_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _imported(importtime_stderr: str) -> set[str]:
    """Top-level package names from `python -X importtime` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def _keys(tmp_path, *names: str):
    _relay_cli("keygen", str(tmp_path / "server"))
    allow = tmp_path / "allow"
    allow.mkdir(exist_ok=True)
    for n in names:
        _relay_cli("keygen", str(tmp_path / n), "--name", n)
        (allow / f"{n}.key").write_bytes((tmp_path / n / f"{n}.key").read_bytes())
    return tmp_path / "server", allow


def test_the_relay_and_the_bridge_import_neither_the_node_nor_torch(tmp_path):
    """Serve with CURVE (the path that loads the most), take a client's HELLO, SUB and PUB, and a
    bridge forwarding between two relays: -X importtime lists every module each process loaded."""
    server, allow = _keys(tmp_path, "alice", "bob", "bridge")
    from relay.keys import ClientKeys
    from relay.client import RelayClient
    port_a, port_b = free_port(), free_port()
    a, b = f"tcp://127.0.0.1:{port_a}", f"tcp://127.0.0.1:{port_b}"
    procs = [subprocess.Popen([sys.executable, "-X", "importtime", "-m", "relay", "--bind", addr,
                               "--keys", str(server), "--allow", str(allow), "--trust-bridge", "bridge",
                               "--log-level", "WARNING"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for addr in (a, b)]
    bridge = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "relay", "bridge", a, b, "--swarm", "s",
                               "--node-id", "bridge", "--keys", str(tmp_path / "bridge"),
                               "--server-key-a", str(server / "server.key"),
                               "--server-key-b", str(server / "server.key"), "--log-level", "WARNING"],
                              cwd=ROOT, stderr=subprocess.PIPE, text=True)
    keys = {n: ClientKeys.load(str(tmp_path / n), str(server / "server.key")) for n in ("alice", "bob")}
    pub = RelayClient(a, swarm="s", node_id="alice", keys=keys["alice"]).start()
    sub = RelayClient(b, swarm="s", node_id="bob", keys=keys["bob"]).start()
    try:
        wait_connected(pub, sub, timeout_s=20)
        pub.publish_bytes(raw_rollout("r1"))
        deadline = time.time() + 20
        got = []
        while time.time() < deadline and not got:
            got = sub.poll(timeout_s=0.2)
        assert [d.rollout_id for d in got] == ["r1"]        # through relay A, the bridge, relay B
    finally:
        pub.close()
        sub.close()
        for p in (bridge, *procs):
            p.send_signal(signal.SIGTERM)
    for p in (bridge, *procs):
        _, err = p.communicate(timeout=10)
        loaded = _imported(err)
        assert "zmq" in loaded and "relay" in loaded
        assert not loaded & set(FORBIDDEN), loaded & set(FORBIDDEN)


def test_help_shows_subcommands_defaults_and_help_for_every_flag():
    out = _relay_cli("--help")
    assert out.returncode == 0
    for sub in ("serve", "keygen", "status", "bridge"):
        assert f"\n  {sub} " in out.stdout, sub
    assert "(default: tcp://0.0.0.0:5555)" in out.stdout and "(default: 2048)" in out.stdout
    for cmd in ([], ["serve"], ["keygen"], ["status"], ["bridge"]):
        h = _relay_cli(*cmd, "--help").stdout
        # every option line carries a help text: no flag is listed bare
        opts = [ln for ln in h.splitlines() if ln.strip().startswith("-") and not ln.strip().startswith("-h")]
        assert opts, cmd
        body = h.split("options:", 1)[1]
        blocks = [blk for blk in body.split("\n  -")[1:]]
        for blk in blocks:
            first = blk.splitlines()[0]
            has_help = len(first.split("  ")) > 1 and first.split("  ", 1)[1].strip() or \
                (len(blk.splitlines()) > 1 and blk.splitlines()[1].startswith(" " * 10))
            assert has_help, (cmd, first)
    assert "(default: server)" in _relay_cli("keygen", "--help").stdout
    assert "(default: 3.0)" in _relay_cli("status", "--help").stdout


def test_bind_without_scheme_suggests_tcp():
    out = _relay_cli("--bind", "127.0.0.1:5599")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "tcp://127.0.0.1:5599" in out.stderr, out.stderr


def _assert_stops_fast(r: RelayProc, within_s: float = 2.0) -> None:
    t0 = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    try:
        rc = r.proc.wait(within_s + 1.0)
    except subprocess.TimeoutExpired:
        r.proc.kill()
        raise AssertionError("relay ignored SIGTERM")
    dt = time.monotonic() - t0
    assert rc == 0 and dt <= within_s, (rc, dt)


def test_sigterm_stops_the_relay_idle_and_under_load(tmp_path):
    r = RelayProc()
    r.wait_ready()
    _assert_stops_fast(r)

    r = RelayProc("--rate", "0", "--rate-mb", "0", "--accept-rate", "0")
    r.wait_ready()
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.connect(r.address)
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": "x", "protocol": P.RELAY_PROTOCOL})])
    s.send_multipart([P.SUB, b"t", orjson.dumps({"epoch": None, "last_seq": 0})])
    for i in range(20000):                     # a backlog of PUBs and a subscriber that never reads
        s.send_multipart([P.PUB, b"t", raw_rollout(f"r{i}", b"x" * 1000)])
    assert wait_for(lambda: any(p["node_id"] == "x" and p["in_msgs"] > 0 for p in r.stats()["peers"]))   # busy
    _assert_stops_fast(r)
    s.close(0)


@pytest.mark.slow       # a real node/relay process end to end: CI's slow tier (README command < 20 min)
def test_sigterm_stops_a_curve_relay_and_one_whose_log_pipe_is_full(tmp_path):
    server, allow = _keys(tmp_path, "alice")
    r = RelayProc("--keys", str(server), "--allow", str(allow))
    from relay.keys import ClientKeys
    r.wait_ready(ClientKeys.load(str(tmp_path / "alice"), str(server / "server.key")))
    _assert_stops_fast(r)
    # An orphaned relay: its stdout is a pipe nobody reads. Refused handshakes are logged at
    # INFO until the pipe is full and the relay blocks in a log write; SIGTERM must still work.
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{port}", "--keys",
                             str(server), "--allow", str(allow), "--log-level", "DEBUG"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ctx = zmq.Context()
    try:
        deadline = time.time() + 30
        # Each refused handshake logs a few hundred bytes; 64 KiB of pipe fills after a few hundred.
        while time.time() < deadline:
            socks = []
            for _ in range(50):
                c = ctx.socket(zmq.DEALER)
                c.setsockopt(zmq.LINGER, 0)
                c.connect(f"tcp://127.0.0.1:{port}")
                socks.append(c)
            wait_for(lambda: "pipe" in open(f"/proc/{proc.pid}/wchan").read(), 0.3)   # until the pipe fills
            for c in socks:
                c.close(0)
            with open(f"/proc/{proc.pid}/wchan") as f:
                if "pipe" in f.read():
                    break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)
        assert time.monotonic() - t0 <= 2.5
    finally:
        if proc.poll() is None:
            proc.kill()
        ctx.term()


def _doc_block(marker: str) -> str:
    text = open(os.path.join(ROOT, "docs", "relay.md"), encoding="utf-8").read()
    after = text.split(f"<!-- test: {marker} -->", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def test_the_curve_recipe_in_docs_works_as_written(tmp_path, monkeypatch):
    """docs/relay.md's CURVE recipe, run line by line (`ftis-relay` -> `python -m relay`, the
    bind address -> a free loopback port), then the node side from its TOML: the node loads the
    keys exactly as node.py does and connects as the id its certificate names."""
    port = free_port()
    relay_proc = None
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT}
    for line in _doc_block("curve-relay").splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd:
            continue
        cmd = cmd.replace("ftis-relay", f"{sys.executable} -m relay").replace(
            "tcp://0.0.0.0:5555", f"tcp://127.0.0.1:{port}")
        if " --bind " in cmd:
            relay_proc = subprocess.Popen(cmd, shell=True, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
        else:
            out = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, (cmd, out.stderr)
    assert relay_proc is not None
    try:
        from ftis_edge import config
        from ftis_edge.peers.swarm import ClientKeys, SwarmClient
        (tmp_path / "alice.toml").write_text(_doc_block("curve-node").replace(
            "tcp://relay.example:5555", f"tcp://127.0.0.1:{port}"))
        cfg = config.load(tmp_path / "alice.toml")
        keys = ClientKeys.load(cfg.swarm.client_keys, cfg.swarm.server_key)
        c = SwarmClient(cfg.swarm.relay, swarm=cfg.swarm.name, node_id=cfg.node_id, keys=keys).start()
        try:
            deadline = time.time() + 15
            while c.health()["state"] != "connected" and time.time() < deadline:
                time.sleep(0.05)
            assert c.health()["state"] == "connected", (c.health(), relay_proc.poll())
        finally:
            c.close()
    finally:
        os.killpg(relay_proc.pid, signal.SIGTERM)
        relay_proc.wait(10)
