"""What the relay holds for its subscribers is bounded by what it knows, not by what they say,
end to end on a real relay (the rules themselves, with a made-up clock: tests/test_relay_queued.py).

A subscriber that never reads but reports having read everything (PING ``rx = 2**60``, or a
made-up MARK) is held back at its own cap; twenty honest non-reading subscribers together are
held at the total cap (each gets its share); a reader (the real client) still gets everything;
a subscriber that fills its queue and then says BYE, goes silent, or keeps pinging without
reading is dropped and its connection cut, so what was queued for it is freed; and
``ftis-relay status`` says who is held back, with every peer-chosen string escaped. Every wait
here waits for what it means (procs.wait_for), never a fixed time.
"""
from __future__ import annotations

import os
import time

import orjson
import pytest
import zmq

from relay import protocol as P
from relay.cli import format_stats
from relay.client import RelayClient
from messages import dealer, hello, join, raw_rollout, replies, subscribe
from procs import wait_connected, wait_for
from ftis_edge.tasks.grader import _vm_bytes
from testkit import askers

pytestmark = pytest.mark.timeout(120)
MB = 1 << 20


def _liar_pings(s, n=2) -> None:
    """What a non-reader can claim: everything read, and a MARK it never received."""
    for _ in range(n):
        s.send_multipart([P.PING, orjson.dumps({"t": 0, "rx": 2 ** 60, "mark": os.urandom(8).hex()})])


def _publish(pub, n, size):
    body = os.urandom(size)
    for i in range(n):
        pub.publish_bytes(raw_rollout(f"big-{i}-{os.urandom(3).hex()}", body))


def _subscribed(r, n, *clients):
    """The clients connected and n subscriptions on topic s at the relay."""
    wait_connected(*clients)
    assert wait_for(lambda: r.stats()["topics"].get("s", {}).get("subscribers") == n), r.stats()["topics"]


def _peer(r, node_id):
    return next((p for p in r.stats()["peers"] if p["node_id"] == node_id), None)


def test_a_subscriber_claiming_it_read_everything_is_held_at_its_cap(relay):
    r = relay("--rate", "0", "--rate-mb", "0", "--replay-mb", "128", "--max-queued-mb", "4",
              "--max-total-queued-mb", "64", "--slow-after", "0.5")
    liar = dealer(r.address)
    pub = RelayClient(r.address, swarm="s", node_id="pub", subscribe=False).start()
    reader = RelayClient(r.address, swarm="s", node_id="reader").start()
    try:
        join(liar, "liar")
        _subscribed(r, 2, pub, reader)
        got = set()
        for burst in range(4):
            _publish(pub, 6, MB)
            _liar_pings(liar)
            assert wait_for(lambda: got.update(d.rollout_id for d in reader.poll(timeout_s=0.05))
                            or len(got) >= 6 * (burst + 1), 20)
        assert len(got) == 24                                    # the reader loses nothing
        s = r.stats()
        peers = {p["node_id"]: p for p in s["peers"]}
        assert peers["liar"]["out_bytes"] <= 4 * MB + MB + 4096, peers["liar"]   # its claims bought nothing
        assert peers["liar"]["held_back"] == "own cap"
        assert peers["reader"]["out_bytes"] >= 24 * MB and not peers["reader"]["held_back"]
        assert s["queued"]["bytes"] <= 2 * 64 * MB
        text = format_stats(s)
        assert "held back" in text and "liar" in text.split("held back")[1].split("\n")[0]
    finally:
        liar.close(0)
        pub.close()
        reader.close()


def test_many_non_readers_are_held_at_the_total_cap_and_a_reader_still_gets_all(relay):
    total_mb, n = 16, 20
    r = relay("--rate", "0", "--rate-mb", "0", "--replay-mb", "128", "--max-queued-mb", "8",
              "--max-total-queued-mb", str(total_mb))
    stuck = [dealer(r.address) for _ in range(n)]
    pub = RelayClient(r.address, swarm="s", node_id="pub", subscribe=False).start()
    reader = RelayClient(r.address, swarm="s", node_id="reader").start()
    try:
        for i, s in enumerate(stuck):
            assert hello(s, f"stuck-{i}")[0] == P.WELCOME
            subscribe(s)
        _subscribed(r, n + 1, pub, reader)
        _publish(pub, 24, 512 << 10)
        got = set()
        assert wait_for(lambda: got.update(d.rollout_id for d in reader.poll(timeout_s=0.05)) or len(got) == 24, 40)
        s = r.stats()
        out = sum(p["out_bytes"] for p in s["peers"] if p["node_id"].startswith("stuck-"))
        # without a total cap: 20 x 8 MB = 160 MB; with it, at most twice the cap all told
        assert out <= 2 * total_mb * MB, out
        assert s["queued"]["bytes"] <= 2 * total_mb * MB
        held = [p for p in s["peers"] if p["held_back"]]
        assert len(held) >= n // 2 and all(p["node_id"].startswith("stuck-") for p in held)
    finally:
        for s in stuck:
            s.close(0)
        pub.close()
        reader.close()


def test_a_non_reader_that_says_bye_goes_silent_or_only_pings_is_cut_and_its_bytes_freed(relay):
    """Issue 51.2: each kept its connection open and so its full queue counted ("ghost" bytes),
    and every new connection got a fresh cap. Now each is dropped (BYE; silent for
    --peer-timeout; or holding bytes with no read proven for as long) and its connection cut:
    libzmq frees the pipe, and the relay's count falls back to what the reader holds."""
    r = relay("--rate", "0", "--rate-mb", "0", "--replay-mb", "128", "--max-queued-mb", "4",
              "--peer-timeout", "3", log_level="INFO")
    byer, silent, pinger = dealer(r.address), dealer(r.address), dealer(r.address)
    pub = RelayClient(r.address, swarm="s", node_id="pub", subscribe=False).start()
    try:
        for s, name in ((byer, "byer"), (silent, "silent"), (pinger, "pinger")):
            join(s, name)
        _subscribed(r, 3, pub)
        _publish(pub, 8, MB)
        assert wait_for(lambda: r.stats()["queued"]["bytes"] >= 3 * 3 * MB)     # each at its own cap (4 MB)
        byer.send_multipart([P.BYE])
        assert wait_for(lambda: _peer(r, "byer") is None)
        # the pinger stays live (PINGs claiming nothing) but reads nothing
        assert wait_for(lambda: pinger.send_multipart([P.PING, orjson.dumps({"t": 0})])
                        or r.stats()["counts"].get("cut", 0) >= 3, 20, every_s=0.4)
        # what is left: replies (counted too, issue 62.1) to the publisher and to the asker itself
        assert wait_for(lambda: (q := r.stats()["queued"])["bytes"] < 16 << 10 and q["ghosts"] == 0, 10), \
            r.stats()["queued"]
        assert {p["node_id"] for p in r.stats()["peers"]} <= {"pub", "ftis-relay-status"}
    finally:
        for s in (byer, silent, pinger):
            s.close(0)
        pub.close()
    assert r.stop() == 0
    log = r.proc.stdout.read()
    assert "byer left: said bye" in log and "silent left: timed out" in log, log
    assert "pinger left: proved no read for 3 s while holding" in log, log
    assert "joined from 127.0.0.1" in log and "joined from ?" not in log


def test_connections_that_ask_and_never_read_are_shed_and_honest_requests_are_answered(relay):
    """Issue 62.1: connections that HELLO, SUB and ask STATS (and PING) at the allowed rate and
    never read grew the relay by GBs while its count said 2 KB, and starved the honest. Replies
    are now queued bytes: counted, capped, and a connection over its cap is shed; every kind of
    honest request is still answered (benchmarks/attacks/relay_replies.py: the same at 300)."""
    total_mb = 8
    r = relay("--max-queued-mb", "1", "--max-total-queued-mb", str(total_mb))
    ctx = zmq.Context()
    crowd = []
    for i in range(100):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.connect(r.address)
        askers.join(s, i)
        crowd.append(s)
    pub = RelayClient(r.address, swarm="swarm", node_id="honest-pub", subscribe=False).start()
    reader = RelayClient(r.address, swarm="swarm", node_id="honest-reader").start()
    rss0 = _vm_bytes("VmRSS", r.proc.pid)
    answered, probes, peak, received = dict.fromkeys(askers.KINDS, 0), 0, 0, set()
    try:
        wait_connected(pub, reader)
        t0 = next_probe = time.time()
        k = 0
        while time.time() - t0 < 10:
            k += 1
            for i, s in enumerate(crowd):
                try:
                    if k % 8 == 0:
                        askers.join(s, i)          # a connection cut comes back as a new one
                    s.send_multipart([P.PING, orjson.dumps({"t": 0})], zmq.NOBLOCK)
                    if k % 2 == 0:
                        s.send_multipart([P.STATS], zmq.NOBLOCK)
                except zmq.Again:                  # cut, not reconnected yet
                    pass
            pub.publish_bytes(raw_rollout(f"honest-{k}", os.urandom(4096)))
            received.update(d.rollout_id for d in reader.poll(timeout_s=0.2))
            if time.time() >= next_probe:
                next_probe += 1.0
                probes += 1
                for kind in askers.probe(ctx, r.address):
                    answered[kind] += 1
                peak = max(peak, r.stats()["queued"]["bytes"])
        assert wait_for(lambda: received.update(d.rollout_id for d in reader.poll(timeout_s=0.05))
                        or len(received) == k, 10), (len(received), k)
        assert pub.stats()["acked"] == k
        assert all(n >= 0.9 * probes for n in answered.values()), (answered, probes)
        s = r.stats()
        band = total_mb * MB // 8
        assert peak <= 2 * total_mb * MB + 2 * band, peak
        assert s["counts"].get("shed", 0) > 0, s["counts"]
        assert _vm_bytes("VmHWM", r.proc.pid) - rss0 < 64 * MB          # was ~1.5 MB a second per 10 askers
    finally:
        for s in crowd:
            s.close(0)
        ctx.term()
        pub.close()
        reader.close()


def test_status_and_log_escape_peer_strings(relay):
    """Node ids and topics are the peers' choice: OSC 52 (clipboard), a screen clear, a
    hyperlink and a right-to-left override reach neither `ftis-relay status` nor the log."""
    evil = "\u202eevil\x1b]52;c;eA==\x07\x1b[2J\x1b]8;;http://evil.example\x1b\\x"
    r = relay("--peer-timeout", "1", log_level="INFO")
    s = dealer(r.address)
    try:
        assert hello(s, evil)[0] == P.WELCOME
        s.send_multipart([P.SUB, evil[:40].encode(), orjson.dumps({"epoch": None, "last_seq": 0})])
        replies(s, n=1)
        text = format_stats(r.stats())
        assert "\\u202eevil\\x1b]52" in text, text
        assert not any(c in text for c in ("\x1b", "\x07", "\u202e"))
        assert wait_for(lambda: _peer(r, evil) is None)          # timed out: the log names it
        assert r.stop() == 0
        log = r.proc.stdout.read()
        assert "left: timed out, silent for" in log and "\\u202eevil\\x1b]52" in log, log
        assert "\x1b" not in log and "\u202e" not in log and "\x07" not in log
    finally:
        s.close(0)
