"""Issue 17 on one relay: delivery budgets (K per window, fair across publishers, filters) and
honest ACKs under overload (NACK busy instead of skipping what was ACKed)."""
from __future__ import annotations

import time

import orjson
import pytest
import zmq

from relay import protocol as P
from relay.client import RelayClient
from messages import raw_rollout
from procs import settled, subscribed, wait_connected, wait_for

pytestmark = pytest.mark.timeout(90)


def _drain(c: RelayClient, until, timeout_s: float) -> list:
    got, deadline = [], time.time() + timeout_s
    while time.time() < deadline and not until(got):
        got += c.poll(timeout_s=0.05)
    return got


def test_budget_k_per_window_fair_across_publishers_and_filtered(relay):
    r = relay("--rate", "0", "--rate-mb", "0")
    greedy = RelayClient(r.address, swarm="s", node_id="greedy", subscribe=False).start()
    calm = [RelayClient(r.address, swarm="s", node_id=f"calm{i}", subscribe=False).start() for i in range(2)]
    budget = RelayClient(r.address, swarm="s", node_id="budget", budget_k=4, budget_window_s=3.0).start()
    everything = RelayClient(r.address, swarm="s", node_id="all").start()
    math_only = RelayClient(r.address, swarm="s", node_id="math", filters={"task": ["math500"]}).start()
    clients = [greedy, *calm, budget, everything, math_only]
    try:
        wait_connected(*clients)
        assert subscribed(r, "budget", "all", "math")
        time.sleep(0.3)     # publish 0.3 s into the budget's window: fresh for 0.3 s of the next one too
        for i in range(40):                                   # the greedy one publishes 20x more
            greedy.publish_bytes(raw_rollout(f"g{i}", task="gsm8k"), task="gsm8k")
        for c in calm:
            c.publish_bytes(raw_rollout(f"{c.node_id}-0", task="gsm8k"), task="gsm8k")
            c.publish_bytes(raw_rollout(f"{c.node_id}-1", task="math500"))
        t0 = time.time()
        first = _drain(budget, lambda g: len(g) >= 4, 2.5)
        assert time.time() - t0 < 2.9
        time.sleep(max(0.0, 2.5 - (time.time() - t0)))
        first += budget.poll()
        senders = [d.sender for d in first]
        assert len(first) == 4, senders                        # K per window, no more
        assert senders.count("greedy") <= 2 and {"calm0", "calm1"} <= set(senders), senders
        second = _drain(budget, lambda g: len(g) >= 4, 4.0)    # the next window: K more, fresh ones
        assert 1 <= len(second) <= 4 and not {d.rollout_id for d in first} & {d.rollout_id for d in second}
        got_all = _drain(everything, lambda g: len(g) >= 44, 5)
        assert len(got_all) == 44                               # "everything" is still possible
        got_math = _drain(math_only, lambda g: len(g) >= 2, 3)
        assert settled(r, math_only)
        got_math += math_only.poll()
        assert sorted(d.rollout_id for d in got_math) == ["calm0-1", "calm1-1"]
        peers = {p["node_id"]: p for p in r.stats()["peers"]}
        assert peers["budget"]["out_msgs"] == len(first) + len(second)   # egress is K per window
        assert peers["budget"]["budget"] == {"s": {"k": 4, "window_s": 3.0}}
    finally:
        for c in clients:
            c.close()


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
def test_overload_turns_into_busy_not_skips(relay):
    """A 50-rollout replay buffer, two publishers flat out, one subscriber that keeps up and one
    that never reads. Old relay: ACK everything, evict, the reading subscriber skips. Now: every
    ACKed rollout reaches the reading subscriber; the overload shows as NACK busy, which the
    clients back off from, and the stuck subscriber stops holding the buffer after --slow-after."""
    r = relay("--rate", "0", "--rate-mb", "0", "--replay", "50", "--slow-after", "1", "--sndhwm", "100",
              "--peer-timeout", "300")       # the stuck one never pings: keep it
    pubs = [RelayClient(r.address, swarm="s", node_id=f"p{i}", subscribe=False).start() for i in range(2)]
    sub = RelayClient(r.address, swarm="s", node_id="reader").start()
    stuck = zmq.Context.instance().socket(zmq.DEALER)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.connect(r.address)
    try:
        wait_connected(*pubs, sub)
        stuck.send_multipart([P.HELLO, orjson.dumps({"node_id": "stuck", "protocol": P.RELAY_PROTOCOL})])
        stuck.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0})])
        assert subscribed(r, "stuck")
        n = 1500
        body = b"x" * 3000
        for i in range(n):
            for p in pubs:
                p.publish_bytes(raw_rollout(f"{p.node_id}-{i}", body))
        got = _drain(sub, lambda g: len(g) >= 2 * n, 60)
        deadline = time.time() + 10          # a delivery can reach the reader before its ACK reaches the publisher
        while any(p.pending() for p in pubs) and time.time() < deadline:
            time.sleep(0.05)
        assert all(p.pending() == 0 for p in pubs), [p.stats() for p in pubs]
        assert len(got) == 2 * n and len({d.rollout_id for d in got}) == 2 * n
        s = r.stats()
        assert s["rejected"].get("busy", 0) > 0, s["rejected"]
        reader = [p for p in s["peers"] if p["node_id"] == "reader"][0]
        assert reader["skipped"] == 0 and sub.stats()["gaps"] == 0
        assert sum(p.stats()["nacked"].get("busy", 0) for p in pubs) > 0
        assert [p for p in s["peers"] if p["node_id"] == "stuck"][0]["skipped"] > 0   # slow: not holding
    finally:
        stuck.close(0)
        for c in (*pubs, sub):
            c.close()


def test_a_new_rollout_visits_only_subscribers_with_budget_left(relay):
    """The candidate index: once 60 budgeted subscribers have spent their budget, more
    rollouts cost no subscriber visits (the scan before the index visited all 60 per rollout)."""
    r = relay("--rate", "0", "--rate-mb", "0")
    ctx = zmq.Context()
    socks = []
    try:
        def dealer(name: str, sub: dict | None) -> zmq.Socket:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(r.address)
            s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})])
            assert s.poll(5000) and s.recv_multipart()[0] == P.WELCOME
            if sub is not None:
                s.send_multipart([P.SUB, b"s", orjson.dumps(sub)])
                assert s.poll(5000) and s.recv_multipart()[0] == P.SUBOK
            socks.append(s)
            return s

        subs = [dealer(f"sub{i}", {"epoch": None, "last_seq": 0, "budget": {"k": 1, "window_s": 60}})
                for i in range(60)]
        pub = dealer("pub", None)

        def publish(i: int) -> None:
            pub.send_multipart([P.PUB, b"s", raw_rollout(f"r{i:04d}", b"x" * 64)])
            assert pub.poll(5000) and pub.recv_multipart()[0] == P.ACK

        publish(0)
        for s in subs:                          # each gets its one rollout of the window ...
            assert s.poll(5000)
            f = s.recv_multipart()
            assert f[0] == P.DELIVER and P.unpack_deliver(f[1])[4] == b"r0000"
        visits = r.stats()["counts"]["budget_visits"]
        for i in range(1, 41):                  # ... and then nothing: 40 more rollouts
            publish(i)
        assert wait_for(lambda: r.stats()["counts"]["accepted"] == 41)   # (a delivery goes out in the ACK's pass)
        after = r.stats()["counts"]
        assert after["accepted"] == 41 and after["budget_sent"] == 60
        assert after["budget_visits"] - visits <= 5, after     # was 60 x 40 = 2,400 by the scan
        assert all(not s.poll(0) for s in subs)
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


def test_a_subscribers_own_publishing_takes_no_share_of_its_budget(relay):
    """Two nodes, K = 2 each, both publishing (the cross-tokenizer node test's shape): a
    node's own rollouts are never offered to it, so they must not count as an active
    publisher when its fair shares are computed — both of the other node's groups arrive in
    the same window, not one now and the other (stale by then) never."""
    r = relay("--rate", "0", "--rate-mb", "0")
    a = RelayClient(r.address, swarm="s", node_id="a", budget_k=2, budget_window_s=5.0).start()
    b = RelayClient(r.address, swarm="s", node_id="b", budget_k=2, budget_window_s=5.0).start()
    try:
        wait_connected(a, b)
        assert subscribed(r, "a", "b")
        a.publish_bytes(raw_rollout("a0"))
        a.publish_bytes(raw_rollout("a1"))
        assert wait_for(lambda: a.pending() == 0, 5)            # a's are in before b's
        b.publish_bytes(raw_rollout("b0"))
        b.publish_bytes(raw_rollout("b1"))
        got_a = _drain(a, lambda g: len(g) >= 2, 3.0)
        got_b = _drain(b, lambda g: len(g) >= 2, 3.0)
        assert sorted(d.rollout_id for d in got_a) == ["b0", "b1"]
        assert sorted(d.rollout_id for d in got_b) == ["a0", "a1"]
    finally:
        a.close()
        b.close()


def test_a_reading_subscriber_is_not_judged_slow_because_of_sybil_pipes(relay):
    """Issue 30.5: "slow" means full while another subscriber *reads*. A budgeted Sybil
    subscriber's pipe is never full (K per window) but proves nothing: before, it made a
    reading subscriber whose reads stalled for longer than --slow-after (a busy node) "slow",
    so it lost its hold on the buffer and skipped ACKed rollouts. Now it keeps its hold
    (publishers get `busy`) and receives every ACKed rollout."""
    r = relay("--rate", "0", "--rate-mb", "0", "--replay", "50", "--slow-after", "0.5", "--sndhwm", "50",
              "--peer-timeout", "300")
    pubs = [RelayClient(r.address, swarm="s", node_id=f"p{i}", subscribe=False).start() for i in range(2)]
    ctx = zmq.Context()
    reader = ctx.socket(zmq.DEALER)
    reader.setsockopt(zmq.LINGER, 0)
    reader.setsockopt(zmq.RCVHWM, 1)
    reader.setsockopt(zmq.RCVBUF, 4096)
    reader.connect(r.address)
    sybils = []
    try:
        wait_connected(*pubs)
        reader.send_multipart([P.HELLO, orjson.dumps({"node_id": "reader", "protocol": P.RELAY_PROTOCOL})])
        reader.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0})])
        for i in range(5):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(r.address)
            s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"sybil-{i}", "protocol": P.RELAY_PROTOCOL})])
            s.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0,
                                                         "budget": {"k": 1, "window_s": 60}})])
            sybils.append(s)
        assert subscribed(r, "reader", *(f"sybil-{i}" for i in range(5)))
        n = 300
        for i in range(n):                       # 30 KB each: more than the socket buffers hide
            for p in pubs:
                p.publish_bytes(raw_rollout(f"{p.node_id}-{i}", b"x" * 30_000))
        got, deadline = set(), time.time() + 60
        while len(got) < 2 * n and time.time() < deadline:
            if reader.poll(100):
                f = reader.recv_multipart()
                if f[0] == P.DELIVER:
                    got.add(P.unpack_deliver(f[1])[4])
                    if len(got) == 100:
                        time.sleep(2.0)          # a stall (the node is busy): its pipe fills
                elif f[0] == P.MARK and f[1]:    # proves what it read, as the real client does
                    reader.send_multipart([P.PING, orjson.dumps({"t": 0, "mark": f[1].hex()})])
        s = r.stats()
        me = [p for p in s["peers"] if p["node_id"] == "reader"][0]
        assert me["skipped"] == 0 and len(got) == 2 * n, (me, len(got))
        assert s["rejected"].get("busy", 0) > 0, s["rejected"]      # the flood was held back instead
    finally:
        for sock in (reader, *sybils):
            sock.close(0)
        for c in pubs:
            c.close()
        ctx.term()
