"""Federation across three relays (issue 17): a line A-B-C and a triangle A-B-C-A of real relay
processes joined by real `ftis-relay bridge` processes, with nodes on each relay."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import orjson
import pytest

from ftis_edge.rollout import wire
from ftis_edge.peers.swarm import SwarmClient
from relay import protocol as P
from messages import dealer, hello, make_rollout
from procs import ROOT, RelayProc, settled, wait_for

pytestmark = pytest.mark.timeout(120)


class Bridge:
    def __init__(self, name: str, a: RelayProc, b: RelayProc):
        self.name, self.a, self.b = name, a, b
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", "bridge", "--swarm", "s", "--node-id", self.name,
                                      self.a.address, self.b.address, "--log-level", "INFO"],
                                     cwd=ROOT, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        """SIGTERM; returns the bridge's final counters from its log."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=15)
        assert self.proc.returncode == 0, err[-2000:]
        line = [ln for ln in err.splitlines() if "bridge stopped:" in ln][-1]
        return orjson.loads(line.split("bridge stopped:", 1)[1])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def net():
    procs = {"relays": [], "bridges": [], "clients": []}

    def relays(n: int, flags: list | None = None):
        rs = [RelayProc(*(flags[i] if flags else ("--trust-bridge", "ab", "--trust-bridge", "bc", "--trust-bridge", "ca",
                                                   "--open-bridges"))) for i in range(n)]
        for r in rs:
            r.wait_ready()
        procs["relays"] += rs
        return rs

    def bridge(name, a, b):
        br = Bridge(name, a, b)
        procs["bridges"].append(br)
        return br

    def client(r, name, **kw):
        c = SwarmClient(r.address, swarm="s", node_id=name, **kw).start()
        procs["clients"].append(c)
        return c
    yield relays, bridge, client
    for c in procs["clients"]:
        c.close()
    for b in procs["bridges"]:
        if b.proc.poll() is None:
            b.kill()
    for r in procs["relays"]:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


def _bridged(r: RelayProc, *names: str) -> bool:
    peers = {p["node_id"] for p in r.stats()["peers"] if p["topics"]}
    return set(names) <= peers


def _exchange(clients: dict, per_node: int, timeout_s: float = 40) -> tuple[dict, dict]:
    sent = {}
    for n, c in clients.items():
        for _ in range(per_node):
            ro = make_rollout(n, n=2, tokens=16)
            sent[ro.rollout_id] = n
            c.publish(ro)
    want = {n: {rid for rid, s in sent.items() if s != n} for n in clients}
    got = {n: [] for n in clients}
    wait_for(lambda: [got[n].extend(c.poll()) for n, c in clients.items()] and
          all({x.rollout_id for x in got[n]} >= want[n] for n in clients), timeout_s)
    time.sleep(1.0)                         # a silence: anything late would be a duplicate
    for n, c in clients.items():
        got[n] += c.poll()
    return sent, got


def _seen_as(clients: dict, sender: str, receiver: str) -> str:
    """A node's id as another node sees it: NODE on its own relay, NODE@RELAY across a bridge."""
    home = clients[sender].relay_name
    return sender if home == clients[receiver].relay_name else f"{sender}@{home}"


def _assert_exactly_once(sent: dict, got: dict, clients: dict) -> None:
    for n, items in got.items():
        ids = [x.rollout_id for x in items]
        assert sorted(ids) == sorted(rid for rid, s in sent.items() if s != n), (n, len(ids))
        assert all(x.error is None and x.sender == _seen_as(clients, sent[x.rollout_id], n)
                   for x in items), [x.sender for x in items]      # original senders, namespaced
        assert clients[n].stats()["duplicates"] == 0, (n, clients[n].stats())


@pytest.mark.parametrize("shape", ["line", "triangle"])
def test_three_relays_exactly_once_no_loops(net, shape):
    relays, bridge, client = net
    a, b, c = relays(3)
    bridges = [bridge("ab", a, b), bridge("bc", b, c)] + ([bridge("ca", c, a)] if shape == "triangle" else [])
    clients = {"a1": client(a, "a1"), "a2": client(a, "a2"), "b1": client(b, "b1"), "c1": client(c, "c1")}
    assert wait_for(lambda: _bridged(a, "ab") and _bridged(b, "ab", "bc") and _bridged(c, "bc"), 15)
    sent, got = _exchange(clients, per_node=5)
    _assert_exactly_once(sent, got, clients)
    for r in (a, b, c):
        s = r.stats()
        assert s["counts"]["accepted"] == len(sent)          # each relay holds each rollout once
        assert s["rejected"].get("loop", 0) == 0             # nothing was offered back to where it had been
    counters = [br.stop() for br in bridges]
    if shape == "triangle":
        # the ring offers rollouts back towards their origin; the bridges refuse to carry them
        assert sum(cn["not_sent_back"] for cn in counters) > 0, counters


def test_budgets_hold_across_bridges(net):
    relays, bridge, client = net
    a, b, c = relays(3)
    bridge("ab", a, b)
    bridge("bc", b, c)
    pubs = [client(a, f"a{i}", subscribe=False) for i in range(3)] + [client(b, "b0", subscribe=False)]
    thrifty = client(c, "thrifty", budget_k=3, budget_window_s=4.0)
    assert wait_for(lambda: _bridged(a, "ab") and _bridged(b, "ab", "bc") and _bridged(c, "bc", "thrifty"), 15)
    for p in pubs:
        for _ in range(6 if p.node_id == "a0" else 2):          # a0 publishes 3x more than the others
            p.publish(make_rollout(p.node_id, n=2, tokens=16))
    got = []
    wait_for(lambda: got.extend(thrifty.poll()) or len(got) >= 3, 3.5)
    time.sleep(0.3)                         # a silence: a 4th in this window would break its budget
    got += thrifty.poll()
    senders = [x.sender for x in got]
    assert len(got) == 3 and len(set(senders)) == 3, senders        # K per window, one per publisher
    assert all(x.error is None for x in got)


def test_a_bridge_restart_loses_nothing_acked(net):
    relays, bridge, client = net
    a, b, c = relays(3)
    bridge("ab", a, b)
    bc = bridge("bc", b, c)
    pub = client(a, "pub", subscribe=False)
    sub = client(c, "sub")
    assert wait_for(lambda: _bridged(a, "ab") and _bridged(b, "ab", "bc") and _bridged(c, "bc"), 15)
    sent, got = [], []
    for i in range(60):
        ro = make_rollout("pub", n=2, tokens=16)
        sent.append(ro.rollout_id)
        pub.publish(ro)
        got += sub.poll()
        time.sleep(0.03)
        if i == 20:
            bc.kill()                      # mid-stream, SIGKILL: whatever it held in flight is gone
        if i == 40:
            bc.start()                     # a new bridge process re-reads B's replay buffer
    assert wait_for(lambda: got.extend(sub.poll()) or {x.rollout_id for x in got} >= set(sent), 40), \
        (len({x.rollout_id for x in got}), len(sent))
    assert settled(c, sub)
    got += sub.poll()
    assert pub.pending() == 0 and pub.stats()["acked"] == len(sent)
    assert sorted(x.rollout_id for x in got) == sorted(sent)        # every ACKed rollout, exactly once


def test_an_insider_cannot_squat_rollout_ids_across_a_bridge(net):
    """Issue 30.2: mallory, subscribed on relay A, republishes each of alice's new rollouts to
    relay B (as herself) before the bridge A-B carries them (here: the bridge starts after
    her, which is what being faster than it amounts to). Relays used to deduplicate by rollout
    id alone (first writer wins), so B dropped the bridge's genuine copies and carol on C never
    got them from alice. Dedup now binds the id to its sender and payload: carol gets every one
    of alice's rollouts from alice; mallory's copies are refused at decode (sender_mismatch)."""
    relays, bridge, client = net
    a, b, c = relays(3)
    bridge("bc", b, c)
    alice = client(a, "alice", subscribe=False)
    spy = client(a, "mallory", decode=False)              # the insider: reads A ...
    squat = client(b, "mallory", subscribe=False)          # ... and writes to B
    carol = client(c, "carol")
    assert wait_for(lambda: _bridged(b, "bc") and _bridged(c, "bc"), 15)
    assert wait_for(lambda: all(x.stats()["connected"] for x in (alice, spy, squat, carol)), 10)
    sent = []
    for _ in range(20):
        ro = make_rollout("alice", n=2, tokens=16)
        sent.append(ro.rollout_id)
        alice.publish(ro)
    squatted = set()

    def squat_all() -> bool:
        for d in spy.poll():
            if d.sender == "alice":
                squat.publish_bytes(d.payload)
                squatted.add(d.rollout_id)
        return squatted == set(sent) and squat.pending() == 0

    assert wait_for(squat_all, 15), len(squatted)
    got = []
    assert wait_for(lambda: got.extend(carol.poll()) or len(got) >= 20, 10)   # mallory's copies reach C
    bridge("ab", a, b)                                                         # then the genuine ones

    def genuine() -> set:
        got.extend(carol.poll())
        return {x.rollout_id for x in got if x.sender == f"alice@{alice.relay_name}" and x.error is None}

    wait_for(lambda: genuine() >= set(sent), 20)
    assert genuine() == set(sent), len(genuine())
    forged = [x for x in got if x.sender == f"mallory@{squat.relay_name}"]
    assert len(forged) == 20 and all(x.error is not None and x.error.reason == "sender_mismatch" for x in forged)


def test_bridged_ids_are_namespaced_so_no_bridge_can_pose_as_a_local_node(net):
    """Issue 30.2: a trusted bridge could assert any `origin`, e.g. `bob`, the id of a node on
    another relay (or of a CURVE-bound node of this one). Now a node of relay R is `NODE@R` on
    every other relay: an origin without a namespace, in this relay's own namespace, or outside
    the namespaces its --trust-bridge lists is `NACK bad_origin`, and no local node may HELLO
    with an '@'. Line A - B - C, bob on B, carol on C; the insider `evil` is a trusted bridge on
    C for relay A only; mallory on C claims `bob` (an open relay: a claim) and stays apart."""
    relays, bridge, client = net
    a, b, c = relays(3, [("--name", "relay-a", "--trust-bridge", "ab", "--open-bridges"),
                         ("--name", "relay-b", "--trust-bridge", "ab", "--trust-bridge", "bc", "--open-bridges"),
                         ("--name", "relay-c", "--trust-bridge", "bc=relay-a,relay-b", "--trust-bridge", "evil=relay-a",
                          "--open-bridges")])
    bridge("ab", a, b)
    bridge("bc", b, c)
    alice, bob = client(a, "alice", subscribe=False), client(b, "bob", subscribe=False)
    mallory, carol = client(c, "bob", subscribe=False), client(c, "carol")
    assert wait_for(lambda: _bridged(a, "ab") and _bridged(b, "ab", "bc") and _bridged(c, "bc"), 15)
    assert wait_for(lambda: all(x.stats()["connected"] for x in (alice, bob, mallory, carol)), 10)
    evil = dealer(c.address)
    try:
        assert hello(evil, "evil")[0] == P.WELCOME
        answers = []
        for origin in ("bob", "carol@relay-c", "bob@relay-b", "bob@relay-b@relay-a", "alice@relay-a"):
            node = P.home_id(origin)
            evil.send_multipart([P.PUB, b"s", wire.encode(make_rollout(node, n=2, tokens=8)),
                                 orjson.dumps({"origin": origin})])
            assert evil.poll(5000)
            answers.append(evil.recv_multipart())
        assert [x[0] for x in answers] == [P.NACK] * 4 + [P.ACK], answers
        assert all(x[2] == b"bad_origin" for x in answers[:4]), answers
        # no local id can look like a bridged one
        evil.send_multipart([P.HELLO, orjson.dumps({"node_id": "bob@relay-b", "protocol": P.RELAY_PROTOCOL})])
        assert evil.poll(5000) and evil.recv_multipart()[2] == b"bad_hello"
    finally:
        evil.close(0)
    sent = {}
    for c_, n in ((alice, "alice"), (bob, "bob"), (mallory, "bob")):
        for _ in range(3):
            ro = make_rollout(n, n=2, tokens=16)
            sent[ro.rollout_id] = c_
            c_.publish(ro)
    got = []
    wait_for(lambda: got.extend(carol.poll()) or len({x.rollout_id for x in got} & set(sent)) >= 9, 20)
    by_sender = {}
    for x in got:
        if x.rollout_id in sent:
            assert x.error is None, x.error
            by_sender.setdefault(x.sender, set()).add(sent[x.rollout_id])
    # genuine bob is bob@relay-b, the local claimant is plain bob: two peers, never one
    assert by_sender == {"alice@relay-a": {alice}, "bob@relay-b": {bob}, "bob": {mallory}}, by_sender
