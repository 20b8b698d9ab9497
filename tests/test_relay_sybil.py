"""Issue 25.2 on a real relay: a rollout's tags are its own (the relay filters on the prefix a
receiver decodes, and refuses a PUB whose attrs claim other tags), and fake identities cannot
spend an honest publisher's share of a subscriber's delivery budget. Issue 30.5: what the relay
queues for one subscriber is bounded in bytes."""
from __future__ import annotations

import os
import time

import orjson
import pytest
import torch
import zmq

from ftis_edge.rollout import wire
from ftis_edge.rollout.samples import OWN, TrainSample
from ftis_edge.run.rounds import useful_peers
from relay import protocol as P
from relay.client import USEFUL_MEMORY, RelayClient
from messages import dealer, hello, join, make_rollout, raw_rollout, replies, subscribe
from procs import subscribed, wait_connected

pytestmark = pytest.mark.timeout(90)


def test_a_rollouts_tags_are_read_from_its_prefix_not_claimed(relay):
    """The issue's attack: gsm8k payloads tagged `arith` in the PUB attrs. The relay refuses the
    lie (`NACK tag_mismatch`), an arith subscriber gets nothing, and what a gsm8k subscriber
    gets carries the tags the rollout decodes to (also a reasoning-gym tag)."""
    r = relay()
    pub, arith, gsm = dealer(r.address), dealer(r.address), dealer(r.address)
    try:
        for s, name in ((pub, "sybil"), (arith, "a"), (gsm, "g")):
            assert hello(s, name)[0] == P.WELCOME
        subscribe(arith, {"task": ["arith"]})
        subscribe(gsm, {"task": ["gsm8k", "rg/leg_counting/0"]})
        lie = wire.encode(make_rollout("sybil", task="gsm8k"))
        pub.send_multipart([P.PUB, b"s", lie, orjson.dumps({"task": "arith"})])
        nack = replies(pub, n=1)[0]
        assert nack[0] == P.NACK and nack[2] == b"tag_mismatch", nack
        tok_lie = wire.encode(make_rollout("sybil", task="gsm8k"))
        pub.send_multipart([P.PUB, b"s", tok_lie, orjson.dumps({"task": "gsm8k", "tok": "other"})])
        assert replies(pub, n=1)[0][2] == b"tag_mismatch"
        honest = [wire.encode(make_rollout("sybil", task=t)) for t in ("gsm8k", "rg/leg_counting/0", "arith")]
        for m in honest:                   # untagged attrs: the prefix's tags are used
            pub.send_multipart([P.PUB, b"s", m])
        assert [f[0] for f in replies(pub, n=3)] == [P.ACK] * 3
        got = [P.unpack_deliver(f[1]) for f in replies(gsm, n=2) if f[0] == P.DELIVER]
        assert [wire.decode(d[6]).task for d in got] == ["gsm8k", "rg/leg_counting/0"]
        assert [orjson.loads(d[5])["task"] for d in got] == ["gsm8k", "rg/leg_counting/0"]
        assert {orjson.loads(d[5])["tok"] for d in got} == {"t"}
        only = [P.unpack_deliver(f[1]) for f in replies(arith, n=1) if f[0] == P.DELIVER]
        assert [wire.decode(d[6]).task for d in only] == ["arith"]      # never the gsm8k lie
        assert not replies(arith, wait_ms=300)
    finally:
        for s in (pub, arith, gsm):
            s.close(0)


def test_the_node_names_as_useful_only_peers_whose_samples_it_trained_on():
    """What a node tells the relay after a step (SwarmClient.mark_useful): peers with a sample
    neither dropped by the F- filter nor judged implausible, with a learning signal (junk of
    zero reward in every completion has a zero advantage: zed); nobody when no step ran."""
    samples = [TrainSample([1], [2], [-1.0], None, 0.5, source=s)
               for s in (OWN, "alice", "mallory", "bob", "bob", "eve", "zed", "zed")]
    flags = {"dropped": torch.tensor([0, 0, 0, 1, 0, 1, 0, 0], dtype=torch.bool),
             "implausible": torch.tensor([0, 0, 1, 0, 0, 0, 0, 0], dtype=torch.bool),
             "advantage": torch.tensor([0.5, 0.5, 0.5, 0.0, -0.3, 0.0, 0.0, 0.0])}
    assert useful_peers(samples, flags) == {"alice", "bob"}
    assert useful_peers(samples, None) == set()


def test_a_publisher_drops_out_of_the_useful_list_a_few_steps_after_its_last_signal():
    """Ids that earned "useful" with valid groups and then publish junk are no longer named
    (they kept it for ever: the list only grew); one step without a signal is not enough."""
    c = RelayClient("tcp://127.0.0.1:9", swarm="s", node_id="me", budget_k=8)
    try:
        c.mark_useful({"honest", "fake-1", "fake-2", "me"})
        assert sorted(c._useful_list()) == ["fake-1", "fake-2", "honest"]
        for _ in range(USEFUL_MEMORY - 1):
            c.mark_useful({"honest"})
            assert "fake-1" in c._useful_list()
        c.mark_useful(set())                      # an unlucky step: the honest one stays named
        assert c._useful_list() == ["honest"]
        for _ in range(USEFUL_MEMORY):
            c.mark_useful(set())
        assert c._useful_list() == [] and c._send_useful   # an empty list is told too
    finally:
        c.close()


def _fake_crowd(address: str, n: int, source: str) -> list:
    """n fake ids, one connection each, from another loopback address (another source)."""
    socks = []
    for i in range(n):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{source}:0;{address.removeprefix('tcp://')}")
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"fake-{i}", "protocol": P.RELAY_PROTOCOL})])
        socks.append(s)
    return socks


def test_a_hundred_fake_ids_that_came_first_do_not_keep_a_new_honest_publisher_waiting(relay):
    """On a real relay: 100 fake ids publish junk (accepted, never useful) before an honest
    publisher arrives; the budgeted subscriber (K = 8 per 2 s window) acts like a node, naming
    after each window whom it got a signal from. The honest publisher is tried among the first
    2K deliveries after it publishes, and then gets nearly all it publishes while the fake ids
    keep to the trial slice (one a window). The window is long against one loop turn so the
    honest publisher stays active in every window on a loaded machine too, and the bound on
    junk is counted in windows elapsed, not loop turns."""
    r = relay("--rate", "0", "--rate-mb", "0")
    crowd = _fake_crowd(r.address, 100, "127.0.0.2")
    window_s = 2.0
    sub = RelayClient(r.address, swarm="s", node_id="node", budget_k=8, budget_window_s=window_s,
                      filters={"task": ["gsm8k"]}).start()
    honest = RelayClient(r.address, swarm="s", node_id="honest", subscribe=False).start()
    try:
        wait_connected(sub, honest)

        def junk(round_: int) -> None:
            for i, s in enumerate(crowd):
                s.send_multipart([P.PUB, b"s", raw_rollout(f"junk-{i}-{round_}", task="gsm8k")])
                while s.poll(0):
                    s.recv_multipart()

        for k in range(4):                              # they came first: two windows of junk
            junk(k)
            sub.poll(timeout_s=0.25)
        fakes_before = honest_got = published = 0
        fakes_after, guarded_since = 0, None
        deadline, k = time.time() + 90, 4
        window_senders, window_end = set(), time.time() + window_s
        while honest_got < 24 and time.time() < deadline:
            junk(k)
            k += 1
            honest.publish_bytes(raw_rollout(f"honest-{published}", task="gsm8k"), task="gsm8k")
            published += 1
            got = sub.poll(timeout_s=0.25)
            window_senders |= {d.sender for d in got}
            for d in got:
                if d.sender == "honest":
                    honest_got += 1
                elif honest_got == 0:
                    fakes_before += 1
                elif guarded_since is not None:
                    fakes_after += 1
            if time.time() >= window_end:               # a node names them once a step
                sub.mark_useful(window_senders & {"honest"})   # its groups carry a signal, junk none
                if honest_got and guarded_since is None:
                    guarded_since = time.time()
                window_senders, window_end = set(), time.time() + window_s
        windows = (time.time() - guarded_since) / window_s if guarded_since else 0.0
        assert honest_got >= 24, (honest_got, published)
        assert fakes_before <= 16, fakes_before
        # one junk a window (the trial slice) once the honest one is named useful, plus the
        # window the naming reached the relay in (up to K) and one of slack
        assert fakes_after <= int(windows) + 1 + 8 + 1, (fakes_after, windows)
    finally:
        for s in crowd:
            s.close(0)
        sub.close()
        honest.close()


def test_queued_bytes_per_subscriber_are_bounded(relay):
    """Issue 30.5: the relay's outgoing queue per peer was bounded only in messages (--sndhwm
    1000), so a subscriber that does not read large rollouts made the relay hold up to 1000 of
    them (4 GB at 4 MiB each). Now it sends a peer at most --max-queued-mb of rollout bytes
    beyond what the peer's PINGs say it read: a stuck subscriber gets ~8 MB of 24 MB, while a
    reading one (the real client) still gets everything."""
    r = relay("--rate", "0", "--rate-mb", "0", "--replay-mb", "128", "--max-queued-mb", "8")
    stuck = dealer(r.address)
    pub = RelayClient(r.address, swarm="s", node_id="pub", subscribe=False).start()
    reader = RelayClient(r.address, swarm="s", node_id="reader").start()
    try:
        join(stuck, "stuck")
        wait_connected(pub, reader)
        assert subscribed(r, "stuck", "reader")
        body = os.urandom(1 << 20)
        for i in range(24):
            pub.publish_bytes(raw_rollout(f"big-{i}", body))
        got, deadline = set(), time.time() + 30
        while len(got) < 24 and time.time() < deadline:
            got.update(d.rollout_id for d in reader.poll(timeout_s=0.1))
        assert len(got) == 24                                   # a reader loses nothing
        peers = {p["node_id"]: p for p in r.stats()["peers"]}
        assert peers["stuck"]["out_bytes"] <= (8 << 20) + (1 << 20) + 4096, peers["stuck"]
        assert peers["stuck"]["blocked"] and r.stats()["counts"]["queue_full_bytes"] > 0
        assert peers["reader"]["out_bytes"] >= 24 << 20 and peers["reader"]["queued_bytes"] <= 8 << 20
    finally:
        stuck.close(0)
        pub.close()
        reader.close()
