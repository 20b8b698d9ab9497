"""Relay connections that ask and never read (issue 62.1): how one joins, and what a fresh
connection's four requests get back. The end-to-end test (tests/test_relay_memory.py) and the
attack (benchmarks/attacks/relay_replies.py, at 300 connections) drive the relay with these."""
from __future__ import annotations

import os
import time

import orjson
import zmq

from relay import protocol as P

KINDS = ("WELCOME", "SUBOK", "PONG", "STATS")


def join(s: zmq.Socket, i: int) -> None:
    """Connection ``i`` says HELLO and SUBs to 4 topics nobody publishes on, long names all."""
    name = f"asker-{i}-".ljust(P.MAX_NODE_ID_LEN, "x")      # long names: long STATS replies
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})], zmq.NOBLOCK)
    for t in range(4):
        s.send_multipart([P.SUB, f"quiet-{t}-".ljust(P.MAX_TOPIC_LEN, "x").encode(),
                          orjson.dumps({"epoch": None, "last_seq": 0})], zmq.NOBLOCK)


def probe(ctx: zmq.Context, address: str, timeout_s: float = 3.0) -> set:
    """A fresh connection's four requests: which replies came within timeout_s (it echoes
    any MARK, as a reading client does)."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    got = set()
    try:
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"probe-{os.urandom(3).hex()}",
                                                  "protocol": P.RELAY_PROTOCOL})])
        s.send_multipart([P.SUB, b"swarm", orjson.dumps({"epoch": None, "last_seq": 1 << 40})])
        s.send_multipart([P.PING, orjson.dumps({"t": 0})])
        s.send_multipart([P.STATS])
        deadline = time.time() + timeout_s
        while len(got) < len(KINDS) and time.time() < deadline:
            if not s.poll(50):
                continue
            f = s.recv_multipart()
            kind = f[0].decode(errors="replace")
            if kind in KINDS:
                got.add(kind)
            elif f[0] == P.MARK and f[1]:
                s.send_multipart([P.PING, orjson.dumps({"t": 0, "mark": f[1].hex()})])
        s.send_multipart([P.BYE], zmq.NOBLOCK)
    finally:
        s.close(0)
    return got
