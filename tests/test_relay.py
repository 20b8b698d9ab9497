"""ftis-relay + SwarmClient over real sockets on 127.0.0.1 (the relay runs as a real process)."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import orjson
import pytest
import zmq

from ftis_edge.rollout import wire
from ftis_edge.peers.swarm import SwarmClient
from relay import protocol as P
from relay.cli import query_stats
from relay.keys import ClientKeys
from messages import make_rollout
from procs import ROOT, fence, free_port, settled, wait_connected, wait_for

pytestmark = pytest.mark.timeout(30)


def collect(clients: dict[str, SwarmClient], until, timeout_s: float = 10.0) -> dict[str, list]:
    got = {k: [] for k in clients}
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for k, c in clients.items():
            got[k] += c.poll()
        if until(got):
            break
        time.sleep(0.02)
    return got


def test_three_clients_each_receive_the_others_exactly_once(relay):
    r = relay()
    names = ["a", "b", "c"]
    clients = {n: SwarmClient(r.address, swarm="s", node_id=n).start() for n in names}
    try:
        wait_connected(*clients.values())
        sent = {n: [] for n in names}
        for n, c in clients.items():
            for _ in range(5):
                ro = make_rollout(n)
                sent[n].append(ro.rollout_id)
                c.publish(ro)
        got = collect(clients, lambda g: all(len(v) >= 10 for v in g.values()))
        assert settled(r, *clients.values())
        for n, c in clients.items():
            got[n] += c.poll()
            ids = [x.rollout.rollout_id for x in got[n]]
            assert all(x.error is None for x in got[n])
            expected = {i for m in names if m != n for i in sent[m]}
            assert sorted(ids) == sorted(expected), f"{n} got {len(ids)} items"
            assert {x.sender for x in got[n]} == set(names) - {n}
            assert c.pending() == 0 and c.stats()["acked"] == 5
            assert {p["node_id"] for p in c.peers()} == set(names) - {n}
    finally:
        for c in clients.values():
            c.close()


def test_wait_pending_blocks_until_the_relay_acks(relay):
    """wait_pending() (a publisher's flow control) blocks while rollouts await their ACK and
    returns once the relay has acknowledged them, without polling."""
    port = free_port()
    c = SwarmClient(f"tcp://127.0.0.1:{port}", swarm="s", node_id="alice", subscribe=False).start()
    try:
        for _ in range(3):
            c.publish(make_rollout("alice"))
        t0 = time.monotonic()
        assert c.wait_pending(0, timeout_s=0.3) == 3          # no relay yet: it times out
        assert time.monotonic() - t0 >= 0.25
        assert c.wait_pending(3, timeout_s=5.0) == 3          # already true: returns at once
        relay(port=port)
        assert c.wait_pending(0, timeout_s=15.0) == 0
        assert c.stats()["acked"] == 3 and c.pending() == 0
    finally:
        c.close()


def test_curve_refuses_unknown_keys(relay, tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "relay", *a], cwd=ROOT, check=True,
                                    capture_output=True, text=True)
    run("keygen", str(tmp_path / "server"))
    run("keygen", str(tmp_path / "alice"), "--name", "alice")
    run("keygen", str(tmp_path / "bob"), "--name", "bob")
    run("keygen", str(tmp_path / "mallory"), "--name", "mallory")
    allow = tmp_path / "allow"
    allow.mkdir()
    for n in ("alice", "bob"):
        (allow / f"{n}.key").write_bytes((tmp_path / n / f"{n}.key").read_bytes())
    server_pub = str(tmp_path / "server" / "server.key")
    keys = {n: ClientKeys.load(str(tmp_path / n), server_pub) for n in ("alice", "bob", "mallory")}
    r = relay("--keys", str(tmp_path / "server"), "--allow", str(allow), keys=keys["alice"])
    clients = {n: SwarmClient(r.address, swarm="s", node_id=n, keys=k).start() for n, k in keys.items()}
    plain = SwarmClient(r.address, swarm="s", node_id="nokey").start()   # no CURVE at all
    try:
        wait_connected(clients["alice"], clients["bob"])
        for n, c in [*clients.items(), ("nokey", plain)]:
            c.publish(make_rollout(n))
        got = collect({**clients, "nokey": plain}, lambda g: len(g["alice"]) >= 1 and len(g["bob"]) >= 1, 8)
        assert settled(r, clients["alice"], clients["bob"], keys=keys["alice"])
        assert [x.sender for x in got["alice"] + clients["alice"].poll()] == ["bob"]
        assert [x.sender for x in got["bob"] + clients["bob"].poll()] == ["alice"]
        for c in (clients["mallory"], plain):
            assert c.poll() == [] and c.pending() == 1 and not c.stats()["connected"]
            assert c.stats()["acked"] == 0
        s = r.stats(keys["alice"])
        assert {p["node_id"] for p in s["peers"]} == {"alice", "bob"}
        assert s["counts"]["accepted"] == 2
        with pytest.raises(TimeoutError):
            query_stats(r.address, keys["mallory"], timeout_s=1.0)
    finally:
        for c in [*clients.values(), plain]:
            c.close()


def _crafted(body_edit=None, prefix_edit=None, header_edit=None) -> bytes:
    """A real message re-packed uncompressed, with its header, arrays or prefix tampered with."""
    good = wire.encode(make_rollout("evil"), codec="none")
    pk = wire.peek(good)
    prefix, body = good[:pk.payload_offset - 4], good[pk.payload_offset:]
    if header_edit:
        hlen = int.from_bytes(body[:4], "little")
        h = wire._pack_header(header_edit(wire._unpack_header(body[4:4 + hlen])))
        body = len(h).to_bytes(4, "little") + h + body[4 + hlen:]
    if body_edit:
        body = body_edit(body)
    if prefix_edit:
        prefix = prefix_edit(prefix)
    return prefix + len(body).to_bytes(4, "little") + body


def test_hostile_input_keeps_the_relay_up_and_is_counted(relay):
    r = relay("--max-msg-kb", "64")
    good_a = SwarmClient(r.address, swarm="s", node_id="good-a").start()
    good_b = SwarmClient(r.address, swarm="s", node_id="good-b").start()
    ctx = zmq.Context.instance()
    evil = ctx.socket(zmq.DEALER)
    evil.setsockopt(zmq.LINGER, 0)
    evil.connect(r.address)
    try:
        wait_connected(good_a, good_b)
        evil.send_multipart([P.HELLO, orjson.dumps({"node_id": "evil", "protocol": P.RELAY_PROTOCOL})])
        assert evil.poll(3000) and evil.recv_multipart()[0] == P.WELCOME
        evil.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0})])
        rng = np.random.default_rng(1)
        hostile = [
            [os.urandom(50)],                                   # unknown type
            [P.PUB],                                            # wrong frame count
            [P.PUB, b"s"],
            [P.PUB, b"s", b"x", b'{"origin": "y"}'],            # 'origin' from a non-bridge
            [P.PUB, b"s", b"x", b"y", b"z"],
            [P.HELLO, b"{not json"],
            [P.SUB, b"s"],
            [P.PING, os.urandom(9000)],
            [P.PUB, b"s", os.urandom(300)],                     # random bytes: bad magic
            [P.PUB, b"s", wire.encode(make_rollout("evil"))[:10]],                 # truncated
            [P.PUB, b"s", _crafted(prefix_edit=lambda p: p[:3] + b"\x09" + p[4:])],  # version 9
            [P.PUB, b"s", wire.encode(make_rollout("evil")) + os.urandom(70 * 1024)],  # > 64 KiB
            [P.PUB, b"", wire.encode(make_rollout("evil"))],     # empty topic
        ]
        for frames in hostile:
            evil.send_multipart(frames)
        # Well-formed prefixes with poisoned contents: the relay forwards them (it only peeks),
        # the receiver's full validation rejects them with a reason.
        nan_reward = _crafted(header_edit=lambda h: {**h, "rewards": [float("nan")] * len(h["rewards"])})
        def first_id_ffff(b: bytes) -> bytes:            # id 65535 >= vocab 49152
            hlen = int.from_bytes(b[:4], "little")
            h = wire._unpack_header(b[4:4 + hlen])
            at = 4 + hlen + 2 * sum(h["lengths"]) + 4 * h["n_escape"]    # after the log-probs
            return b[:at] + b"\xff\xff" + b[at + 2:]
        big_id = _crafted(first_id_ffff)
        lying_len = _crafted(header_edit=lambda h: {**h, "lengths": [25] + h["lengths"][1:]})
        bomb = wire.encode(make_rollout("evil"), codec="zlib")
        bomb = bomb[:wire.peek(bomb).payload_offset - 4] + (10).to_bytes(4, "little") + bomb[wire.peek(bomb).payload_offset:]
        poisoned = [nan_reward, big_id, lying_len, bomb]
        assert len({wire.peek(m).rollout_id for m in poisoned}) == len(poisoned)
        for payload in poisoned:
            evil.send_multipart([P.PUB, b"s", payload])
        # A frame beyond the socket's MAXMSGSIZE: ZeroMQ drops that connection, relay stays up.
        huge = ctx.socket(zmq.DEALER)
        huge.setsockopt(zmq.LINGER, 0)
        huge.connect(r.address)
        huge.send_multipart([P.PUB, b"s", rng.bytes(2 << 20)])
        # Valid traffic still flows.
        ro = make_rollout("good-a")
        good_a.publish(ro)
        got = collect({"b": good_b}, lambda g: sum(x.sender == "good-a" for x in g["b"]) >= 1
                      and sum(x.sender == "evil" for x in g["b"]) >= len(poisoned))
        from_a = [x for x in got["b"] if x.sender == "good-a"]
        assert [x.rollout.rollout_id for x in from_a] == [ro.rollout_id]
        reasons = sorted(x.error.reason for x in got["b"] if x.sender == "evil")
        assert all(x.rollout is None for x in got["b"] if x.sender == "evil")
        assert reasons == sorted(["bad_value", "id_out_of_range", "length_mismatch", "too_large"]), reasons
        nacks = []
        while evil.poll(200):
            f = evil.recv_multipart()
            if f[0] == P.NACK:
                nacks.append(f[2].decode())
        assert sorted(nacks) == sorted(["bad_frame", "bad_frame", "bad_frame", "untrusted_bridge", "bad_header",
                                        "truncated", "bad_version", "too_large", "bad_topic"]), nacks
        s = r.stats()
        rej = s["rejected"]
        assert rej["bad_frame"] == 7 and rej["bad_header"] == 1 and rej["truncated"] == 1
        assert rej["bad_version"] == 1 and rej["too_large"] == 1 and rej["bad_topic"] == 1
        assert rej["untrusted_bridge"] == 1
        assert r.proc.poll() is None
        huge.close(0)
    finally:
        evil.close(0)
        good_a.close()
        good_b.close()


def test_relay_sigkill_and_restart_loses_no_acknowledged_rollout(relay):
    r = relay()
    pub = SwarmClient(r.address, swarm="s", node_id="pub", dead_after_s=2.0).start()
    sub = SwarmClient(r.address, swarm="s", node_id="sub", dead_after_s=2.0).start()
    try:
        wait_connected(pub, sub)
        sent, received = [], []
        for i in range(40):
            ro = make_rollout("pub", n=2)
            sent.append(ro.rollout_id)
            pub.publish(ro)
            time.sleep(0.01)
            received += sub.poll()
            if i == 20:
                acked_before = pub.stats()["acked"]
                r.kill()                       # mid-stream; nodes keep running
                r.start()                      # same port, new epoch, empty buffers
        assert acked_before > 0
        ok = wait_for(lambda: (received.extend(sub.poll()) or True) and len(received) >= 40
                      and pub.pending() == 0, 15)
        received += fence(pub, sub)[0]
        ids = [x.rollout.rollout_id for x in received]
        assert ok, (len(ids), pub.stats(), sub.stats())
        assert sorted(ids) == sorted(sent)            # every rollout, exactly once
        assert pub.stats()["relay_restarts"] == 1 and sub.stats()["relay_restarts"] == 1
        assert pub.stats()["republished"] >= 1
    finally:
        pub.close()
        sub.close()


def test_a_subscriber_that_never_reads_does_not_stall_the_others(relay):
    r = relay("--rate", "0", "--rate-mb", "0", "--sndhwm", "20", "--replay", "5000")
    pub = SwarmClient(r.address, swarm="s", node_id="pub", codec="none").start()
    fast = SwarmClient(r.address, swarm="s", node_id="fast").start()
    ctx = zmq.Context.instance()
    stuck = ctx.socket(zmq.DEALER)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.connect(r.address)
    try:
        wait_connected(pub, fast)
        stuck.send_multipart([P.HELLO, orjson.dumps({"node_id": "stuck", "protocol": P.RELAY_PROTOCOL})])
        stuck.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0})])
        assert wait_for(lambda: any(p["node_id"] == "stuck" and p["topics"] for p in r.stats()["peers"]), 5)
        # from here on `stuck` is never read
        # 300 x ~37 KB = 11 MB: more than the kernel's socket buffers (4 MB here) can hide.
        n = 300
        template = make_rollout("pub", n=8, tokens=1024)
        t0 = time.time()
        for _ in range(n):
            pub.publish(dataclasses.replace(template, rollout_id=uuid.uuid4().hex))
        got = collect({"fast": fast}, lambda g: len(g["fast"]) >= n, 15)
        dt = time.time() - t0
        assert len(got["fast"]) == n, len(got["fast"])
        s = r.stats()
        slow = [p for p in s["peers"] if p["node_id"] == "stuck"][0]
        fastp = [p for p in s["peers"] if p["node_id"] == "fast"][0]
        assert slow["lag"] > 0 and slow["out_msgs"] < n, slow
        assert fastp["out_msgs"] == n and fastp["lag"] == 0
        print(f"\n{n} rollouts to the reading subscriber in {dt:.2f} s "
              f"({n / dt:.0f}/s) while 'stuck' took {slow['out_msgs']} and lags {slow['lag']}")
    finally:
        stuck.close(0)
        pub.close()
        fast.close()


def test_late_joiner_gets_the_replay_buffer(relay):
    r = relay("--replay", "3")
    pub = SwarmClient(r.address, swarm="s", node_id="early").start()
    try:
        wait_connected(pub)
        sent = []
        for _ in range(5):
            ro = make_rollout("early")
            sent.append(ro.rollout_id)
            pub.publish(ro)
        assert wait_for(lambda: pub.pending() == 0, 5)
        late = SwarmClient(r.address, swarm="s", node_id="late").start()
        try:
            got = collect({"late": late}, lambda g: len(g["late"]) >= 3, 5)
            got["late"] += fence(pub, late)[0]
            assert [x.rollout.rollout_id for x in got["late"]] == sent[-3:], (   # the buffer, in order
                sent, [(x.seq, x.rollout.rollout_id) for x in got["late"]], pub.stats())
            assert late.stats()["replayed"] == 3
        finally:
            late.close()
    finally:
        pub.close()


def test_flooding_client_is_rate_limited_while_others_flow(relay):
    r = relay("--rate", "5", "--burst", "5")
    flood = SwarmClient(r.address, swarm="s", node_id="flood").start()
    calm = SwarmClient(r.address, swarm="s", node_id="calm").start()
    sink = SwarmClient(r.address, swarm="s", node_id="sink").start()
    try:
        wait_connected(flood, calm, sink)
        for _ in range(60):
            flood.publish(make_rollout("flood", n=1, tokens=8))
        calm_ids = []
        for _ in range(3):
            ro = make_rollout("calm")
            calm_ids.append(ro.rollout_id)
            calm.publish(ro)
            assert wait_for(lambda: calm.pending() == 0, 5)     # accepted while the flood is refused
        got = collect({"sink": sink}, lambda g: sum(x.sender == "calm" for x in g["sink"]) >= 3, 5)
        assert [x.rollout.rollout_id for x in got["sink"] if x.sender == "calm"] == calm_ids
        fs = flood.stats()
        assert fs["nacked"].get("rate_limited", 0) > 10, fs
        assert fs["pending"] > 0              # kept and retried later, not dropped
        assert r.stats()["rejected"]["rate_limited"] > 10
    finally:
        for c in (flood, calm, sink):
            c.close()


def test_status_cli_and_clean_sigterm(relay):
    r = relay(log_level="INFO")                      # INFO: the shutdown line below is logged
    c = SwarmClient(r.address, swarm="swarm-x", node_id="node-status").start()
    try:
        wait_connected(c)
        c.publish(make_rollout("node-status"))
        assert wait_for(lambda: c.pending() == 0, 5)
        out = subprocess.run([sys.executable, "-m", "relay", "status", "--connect", r.address],
                             cwd=ROOT, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, out.stderr
        assert "node-status" in out.stdout and "swarm-x" in out.stdout and "uptime" not in out.stderr
        js = subprocess.run([sys.executable, "-m", "relay", "status", "--connect", r.address, "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=10)
        s = orjson.loads(js.stdout)
        assert s["counts"]["accepted"] == 1 and s["topics"]["swarm-x"]["buffered"] == 1
        assert s["peers"][0]["in_bytes"] > 0
    finally:
        c.close()
    assert wait_for(lambda: "node-status" not in {p["node_id"] for p in r.stats()["peers"]}, 5)
    assert r.stop() == 0
    log = r.proc.stdout.read()
    assert "shutting down" in log                    # SIGTERM took the clean path
    assert "node node-status joined from" in log     # the operator sees who comes and goes, and why
    assert "node node-status left: said bye (0 connected)" in log, log
    stopped = next(line for line in log.splitlines() if "relay stopped after" in line)
    assert "messages accepted" in stopped and "{" not in stopped, stopped   # words, not a dict
    down = subprocess.run([sys.executable, "-m", "relay", "status", "--connect", r.address, "--timeout", "0.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=10)
    assert down.returncode == 1 and "no answer" in down.stderr


def test_a_rollout_claiming_another_sender_is_flagged(relay):
    r = relay()
    liar = SwarmClient(r.address, swarm="s", node_id="liar").start()
    honest = SwarmClient(r.address, swarm="s", node_id="honest").start()
    try:
        wait_connected(liar, honest)
        liar.publish(make_rollout("honest"))          # claims to be "honest" inside the rollout
        got = collect({"h": honest}, lambda g: len(g["h"]) >= 1, 5)
        assert [(x.sender, x.rollout, x.error.reason) for x in got["h"]] == [("liar", None, "sender_mismatch")]
        assert honest.stats()["decode_errors"] == 1
    finally:
        liar.close()
        honest.close()


def test_cli_errors_are_clear(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "relay", *a], cwd=ROOT, capture_output=True,
                                    text=True, timeout=20)
    out = run("keygen", str(tmp_path / "k"))
    assert out.returncode == 0 and "server.key_secret" in out.stdout
    bad = run("--bind", f"tcp://127.0.0.1:{free_port()}", "--keys", str(tmp_path / "k"))
    assert bad.returncode == 2 and "--allow" in bad.stderr
    missing = run("--bind", f"tcp://127.0.0.1:{free_port()}", "--keys", str(tmp_path / "nope"),
                  "--allow", str(tmp_path))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bind = run("--bind", "tcp://256.1.1.1:1")
    assert bind.returncode == 2 and "cannot bind" in bind.stderr


def test_federation_bridge_joins_two_relays(relay):
    ra = relay("--trust-bridge", "bridge-1", "--open-bridges")
    rb = relay("--trust-bridge", "bridge-1", "--open-bridges")
    bridge = subprocess.Popen([sys.executable, "-m", "relay", "bridge", "--swarm", "s", "--node-id", "bridge-1",
                               ra.address, rb.address, "--log-level", "WARNING"], cwd=ROOT)
    clients = {"a1": SwarmClient(ra.address, swarm="s", node_id="a1").start(),
               "a2": SwarmClient(ra.address, swarm="s", node_id="a2").start(),
               "b1": SwarmClient(rb.address, swarm="s", node_id="b1").start()}
    try:
        wait_connected(*clients.values())
        assert wait_for(lambda: any(p["node_id"] == "bridge-1" for p in rb.stats()["peers"]), 5)
        assert wait_for(lambda: all(any(p["node_id"] == "bridge-1" and p["topics"] for p in x.stats()["peers"])
                                    for x in (ra, rb)), 5)          # the bridge's SUBs landed
        sent = {}
        for n, c in clients.items():
            ro = make_rollout(n)
            sent[ro.rollout_id] = n
            c.publish(ro)
        got = collect(clients, lambda g: all(len(v) >= 2 for v in g.values()), 10)
        for src, dst in (("a1", ("a2", "b1")), ("b1", ("a1", "a2"))):     # a fence from each relay's side
            for n, more in zip(dst, fence(clients[src], *(clients[d] for d in dst))):
                got[n] += more
        for n, c in clients.items():
            got[n] += c.poll()
            home = {"a1": ra, "a2": ra, "b1": rb}
            assert sorted((x.sender, x.rollout.rollout_id) for x in got[n]) == sorted(
                (s if home[s] is home[n] else f"{s}@{home[s].stats()['name']}", r)
                for r, s in sent.items() if s != n), n       # original senders (NODE@RELAY across), exactly once
            assert all(x.error is None for x in got[n])
        # an untrusted node cannot pose as a bridge
        liar = SwarmClient(ra.address, swarm="s", node_id="liar").start()
        wait_connected(liar)
        liar.publish_bytes(wire.encode(make_rollout("a1")), origin="a1")
        assert wait_for(lambda: liar.stats()["nacked"].get("untrusted_bridge") == 1, 5)
        liar.close()
    finally:
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(10) == 0
        for c in clients.values():
            c.close()
