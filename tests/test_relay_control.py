"""Issue 30.1: control messages cost O(1) per client. A PONG carries the peer count, not the
peer list (1,000 clients pinging once a second were O(N^2) bytes/s); PINGs are answered at
most P.PING_RATE per connection, twice what a client sends (issue 50.10: at the same rate, two
ordinary nodes had 42 PINGs refused); STATS (O(peers)) needs a HELLO first on an open relay."""
from __future__ import annotations

import time

import orjson
import pytest
import zmq

from relay import protocol as P
from relay.cli import query_stats
from relay.client import RelayClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dealer():
    """dealer(address): a DEALER socket connected there, closed at the end of the test."""
    ctx = zmq.Context()
    socks = []

    def make(address: str) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(address)
        socks.append(s)
        return s
    yield make
    for s in socks:
        s.close(0)
    ctx.term()


def _hello(s: zmq.Socket, name: str) -> None:
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})])
    assert s.poll(5000) and s.recv_multipart()[0] == P.WELCOME


def _replies(s: zmq.Socket, wait_s: float, marks: bool = False) -> list[list[bytes]]:
    """What came within wait_s; without the MARKs the relay sends every second to a connection
    it sent anything (replies are counted until proven read, issue 62.1) unless `marks`."""
    out, deadline = [], time.time() + wait_s
    while time.time() < deadline:
        if s.poll(50):
            f = s.recv_multipart()
            if marks or f[0] != P.MARK:
                out.append(f)
    return out


def test_pong_size_does_not_grow_with_the_number_of_peers(relay, dealer):
    r = relay()
    probe = dealer(r.address)
    _hello(probe, "probe")
    probe.send_multipart([P.PING, orjson.dumps({"t": 1.0})])
    [kind, few] = _replies(probe, 0.5)[0]
    assert kind == P.PONG
    crowd = [dealer(r.address) for _ in range(300)]
    for i, s in enumerate(crowd):
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"node-with-a-long-name-{i:04d}",
                                                 "protocol": P.RELAY_PROTOCOL})])
    for s in crowd:
        assert s.poll(5000) and s.recv_multipart()[0] == P.WELCOME
    probe.send_multipart([P.PING, orjson.dumps({"t": 2.0})])
    [kind, many] = _replies(probe, 0.5)[0]
    pong = orjson.loads(many)
    assert kind == P.PONG and pong["n_peers"] == 301 and pong["known"] is True
    assert len(many) <= len(few) + 4, (len(few), len(many))    # was ~30 bytes per peer


def test_pings_are_answered_at_a_bounded_rate(relay, dealer):
    r = relay()
    s = dealer(r.address)
    _hello(s, "chatty")
    for i in range(200):
        s.send_multipart([P.PING, orjson.dumps({"t": i})])
    pongs = [f for f in _replies(s, 1.0) if f[0] == P.PONG]
    assert 1 <= len(pongs) <= P.PING_BURST + 3, len(pongs)
    assert r.stats()["rejected"]["ping_rate"] >= 185


def test_two_default_clients_exchanging_rollouts_are_never_refused_a_ping(relay):
    """Each delivery batch brings a MARK, and each MARK read a PING (the receipt) on top of the
    heartbeat: a default client's PINGs stay inside a default relay's limit."""
    assert P.CONTROL_RATE <= P.PING_RATE / 2
    r = relay()
    a = RelayClient(r.address, swarm="s", node_id="a").start()
    b = RelayClient(r.address, swarm="s", node_id="b").start()
    try:
        got = {"a": 0, "b": 0}
        end = time.monotonic() + 6
        i = 0
        while time.monotonic() < end:                  # a rollout each way every 50 ms
            for c in (a, b):
                c.publish_bytes(P.pack_prefix("none", f"{c.node_id}-{i}", "", "", 3) + b"abc")
                got[c.node_id] += len(c.poll(timeout_s=0.025))
            i += 1
        s = r.stats()
        assert got["a"] > 50 and got["b"] > 50, got
        assert "ping_rate" not in s["rejected"], s["rejected"]
    finally:
        a.close()
        b.close()


def test_stats_is_refused_before_hello_on_an_open_relay(relay, dealer):
    r = relay()
    s = dealer(r.address)
    s.send_multipart([P.STATS])
    got = _replies(s, 1.0)
    assert got and all(f[0] != P.STATS for f in got), got
    assert got[0][0] == P.NACK and got[0][2] == P.HELLO_FIRST.encode()
    _hello(s, "operator")
    s.send_multipart([P.STATS])
    got = _replies(s, 1.0, marks=True)
    # a MARK follows: the asker may prove it read the reply (replies are counted, issue 62.1)
    kinds = [f[0] for f in got]
    assert [k for k in kinds if k != P.MARK] == [P.STATS] and kinds[-1] == P.MARK, kinds
    assert orjson.loads(got[kinds.index(P.STATS)][1])["peers"]
    # the status command says HELLO first (and BYE after), so it still works
    assert query_stats(r.address)["counts"]["hello"] >= 2


def test_the_client_reports_the_relays_peer_count(relay):
    r = relay()
    clients = [RelayClient(r.address, swarm="s", node_id=f"n{i}").start() for i in range(3)]
    try:
        deadline = time.time() + 10
        while not all(c.stats()["relay_peers"] == 3 for c in clients):
            assert time.time() < deadline, [c.stats() for c in clients]
            time.sleep(0.05)
    finally:
        for c in clients:
            c.close()
