"""The node's only door to the swarm: a relay client with acked publishing, deduplicated
receiving, heartbeats and automatic recovery from a relay restart (docs/relay.md).

All network I/O happens on one background thread that owns the ZeroMQ socket; the training
loop only touches thread-safe queues, so it never blocks on the network.

Delivery guarantee across a relay restart: the relay has an epoch (a random id per run).
The client keeps every acknowledged rollout for `keep_acked_s`; when it sees a new epoch it
says HELLO again, re-subscribes from the start of the new relay's buffer and re-publishes
what it kept. Receivers drop duplicates by rollout id, so each accepted rollout is
delivered exactly once while publisher and subscriber stay up.
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import orjson
import zmq

from ftis_edge import wire
from ftis_edge.waker import Waker
from ftis_edge.wire import Rollout, WireError
from relay import protocol as P
from relay.keys import ClientKeys

__all__ = ["SwarmClient", "Received", "ClientKeys"]

log = logging.getLogger(__name__)      # ftis_edge.swarm: lands in node.log with the rest


@dataclass
class Received:
    """One rollout that arrived from a peer (or failed to decode: `error` says why)."""

    rollout: Rollout | None
    sender: str                 # node id as attested by the relay
    nbytes: int
    error: WireError | None = None
    seq: int = 0
    topic: str = ""
    received_at: float = field(default_factory=time.time)
    rollout_id: str = ""
    payload: bytes | None = None    # the raw message, kept only when the client does not decode


@dataclass
class _Outgoing:
    rollout_id: bytes
    payload: bytes
    attempts: int = 0
    last_sent: float = 0.0
    not_before: float = 0.0     # rate-limit backoff
    origin: bytes = b""         # bridges only: the node that really sent it


class SwarmClient:
    """Publish rollouts to a relay topic and receive the other nodes' rollouts."""

    def __init__(self, address: str, *, swarm: str, node_id: str, keys: ClientKeys | None = None,
                 ack_timeout_s: float = 2.0, heartbeat_s: float = 1.0, dead_after_s: float = 4.0,
                 keep_acked_s: float = 300.0, keep_acked_max: int = 4096,
                 inbox_max: int = 10_000, dedup_max: int = 200_000,
                 limits: wire.WireLimits = wire.DEFAULT_LIMITS, codec: str = wire.DEFAULT_CODEC,
                 subscribe: bool = True, decode: bool = True):
        if not swarm or len(swarm.encode()) > P.MAX_TOPIC_LEN:
            raise ValueError(f"swarm name must be 1..{P.MAX_TOPIC_LEN} bytes")
        if not node_id or len(node_id.encode()) > P.MAX_NODE_ID_LEN:
            raise ValueError(f"node_id must be 1..{P.MAX_NODE_ID_LEN} bytes")
        self.address, self.swarm, self.node_id = address, swarm, node_id
        self.keys = keys
        self.ack_timeout_s, self.heartbeat_s, self.dead_after_s = ack_timeout_s, heartbeat_s, dead_after_s
        self.keep_acked_s, self.keep_acked_max = keep_acked_s, keep_acked_max
        self.limits, self.codec = limits, codec
        self.subscribe, self.decode = subscribe, decode   # publish-only / raw forwarding (relays)
        self._topic = swarm.encode()
        self._outbox: queue.SimpleQueue[_Outgoing] = queue.SimpleQueue()
        self._inbox: collections.deque[Received] = collections.deque(maxlen=inbox_max)
        self._inbox_cv = threading.Condition()
        self._lock = threading.Lock()                  # guards counters and peers below
        self._pending: dict[bytes, _Outgoing] = {}     # I/O thread only
        self._acked: collections.OrderedDict[bytes, tuple[float, bytes, bytes]] = collections.OrderedDict()
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._dedup_max = dedup_max
        self._stats = collections.Counter()
        self._nacked = collections.Counter()
        self._peers: dict[str, dict] = {}
        self._epoch: str | None = None
        self._last_seq = 0
        self._replay_until = 0
        self._connected = False
        self._latency_ms: float | None = None
        self._last_heard = 0.0
        self._stop = threading.Event()
        # publish() writes a byte here so the I/O thread wakes at once instead of finishing
        # its poll timeout (a pipe or socket pair: safe from any thread, zmq sockets are not).
        self._waker = Waker()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None
        self._n_pending = 0

    # -------------------------------------------------------------- public API
    def start(self) -> "SwarmClient":
        """Connect and start the background I/O thread (returns self)."""
        if self._thread is None:
            self._ctx = zmq.Context()
            self._thread = threading.Thread(target=self._run, name=f"swarm-{self.node_id}", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the I/O thread and close the socket (unacked rollouts are abandoned)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._waker.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def publish(self, rollout: Rollout) -> None:
        """Queue a rollout; it is sent and retried in the background until acknowledged.

        Encoding happens here, so a malformed rollout raises WireError in the caller."""
        self.publish_bytes(wire.encode(rollout, codec=self.codec, limits=self.limits))

    def publish_bytes(self, payload: bytes, origin: str | None = None) -> None:
        """Queue an already encoded rollout (forwarding, benchmarks); its prefix is checked.

        `origin` (federation bridges only) names the node that sent it first; the relay
        accepts it only from node ids it runs with --trust-bridge."""
        if self._waker.closed:
            raise RuntimeError("SwarmClient is closed")
        rollout_id = wire.peek(payload, self.limits).rollout_id
        with self._lock:
            self._n_pending += 1
            self._stats["published"] += 1
        self._outbox.put(_Outgoing(rollout_id.encode(), payload, origin=(origin or "").encode()))
        self._waker.wake()

    def poll(self, max_items: int | None = None, timeout_s: float = 0.0) -> list[Received]:
        """Rollouts received since the last call (waits up to timeout_s for the first one)."""
        with self._inbox_cv:
            if not self._inbox and timeout_s > 0:
                self._inbox_cv.wait(timeout_s)
            out = []
            while self._inbox and (max_items is None or len(out) < max_items):
                out.append(self._inbox.popleft())
            return out

    def pending(self) -> int:
        """Published and not yet acknowledged (nor refused)."""
        with self._lock:
            return self._n_pending

    def stats(self) -> dict:
        """Connection state, relay epoch, heartbeat latency and counters (see docs/relay.md)."""
        with self._lock:
            return {
                "connected": self._connected, "relay_epoch": self._epoch,
                "latency_ms": self._latency_ms, "pending": self._n_pending,
                **{k: self._stats.get(k, 0) for k in (
                    "published", "acked", "sent", "resent", "republished", "received",
                    "duplicates", "replayed", "decode_errors", "gaps", "bytes_out", "bytes_in",
                    "relay_restarts", "inbox_dropped")},
                "nacked": dict(self._nacked),
            }

    def peers(self) -> list[dict]:
        """Nodes seen in the relay's peer list (all its clients) or through their rollouts,
        with last_seen (unix s) and the number of rollouts received from each."""
        with self._lock:
            return [dict(node_id=k, **v) for k, v in sorted(self._peers.items())]

    # -------------------------------------------------------------- I/O thread
    def _socket(self) -> zmq.Socket:
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 10_000)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        s.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes + 64 * 1024)
        if self.keys is not None:
            self.keys.apply(s)
        s.connect(self.address)
        return s

    def _run(self) -> None:
        sock = self._socket()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._waker.fileno(), zmq.POLLIN)
        try:
            self._hello(sock)
            next_ping = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_ping:
                    next_ping = now + self.heartbeat_s
                    self._send(sock, [P.PING, orjson.dumps({"t": time.time()})])
                    if self._connected and now - self._last_heard > self.dead_after_s:
                        self._set_connected(False)
                        log.warning("relay %s silent for %.1f s", self.address, now - self._last_heard)
                    if not self._connected:
                        self._hello(sock)      # harmless if it is merely slow
                self._drain_outbox(sock, now)
                self._retry(sock, now)
                events = dict(poller.poll(50))
                if self._waker.fileno() in events:
                    self._waker.drain()
                if sock in events:
                    for _ in range(1000):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            self._on_message(sock, frames)
                        except Exception:       # a bad frame must not kill the client
                            log.exception("bad message from relay")
        finally:
            try:
                self._send(sock, [P.BYE])
            finally:
                sock.close(0)

    def _send(self, sock: zmq.Socket, frames: list[bytes]) -> bool:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _hello(self, sock: zmq.Socket) -> None:
        self._send(sock, [P.HELLO, orjson.dumps({"node_id": self.node_id, "protocol": P.RELAY_PROTOCOL})])

    def _subscribe(self, sock: zmq.Socket) -> None:
        if not self.subscribe:
            return
        self._send(sock, [P.SUB, self._topic, orjson.dumps({"epoch": self._epoch, "last_seq": self._last_seq})])

    def _set_connected(self, value: bool) -> None:
        with self._lock:
            self._connected = value

    def _drain_outbox(self, sock: zmq.Socket, now: float) -> None:
        while True:
            try:
                out = self._outbox.get_nowait()
            except queue.Empty:
                return
            if out.rollout_id in self._pending:      # the same rollout published twice
                with self._lock:
                    self._n_pending -= 1
                continue
            self._pending[out.rollout_id] = out
            if self._connected:
                self._transmit(sock, out, now)

    def _transmit(self, sock: zmq.Socket, out: _Outgoing, now: float) -> None:
        frames = [P.PUB, self._topic, out.payload] + ([out.origin] if out.origin else [])
        if self._send(sock, frames):
            out.attempts += 1
            out.last_sent = now
            with self._lock:
                self._stats["sent" if out.attempts == 1 else "resent"] += 1
                self._stats["bytes_out"] += len(out.payload)

    def _retry(self, sock: zmq.Socket, now: float) -> None:
        if not self._connected:
            return
        for out in list(self._pending.values()):
            if now >= out.not_before and (out.attempts == 0 or now - out.last_sent > self.ack_timeout_s):
                self._transmit(sock, out, now)

    def _on_message(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        now = time.monotonic()
        self._last_heard = now
        kind = frames[0]
        if kind == P.DELIVER and len(frames) == 2:
            self._on_deliver(frames)
        elif kind == P.ACK and len(frames) == 4:
            out = self._pending.pop(frames[1], None)
            if out is not None:
                self._acked[frames[1]] = (now, out.payload, out.origin)
                self._trim_acked(now)
                with self._lock:
                    self._stats["acked"] += 1
                    self._n_pending -= 1
        elif kind == P.NACK and len(frames) == 3:
            self._on_nack(sock, frames[1], frames[2].decode(errors="replace"), now)
        elif kind == P.PONG and len(frames) == 2:
            obj = orjson.loads(frames[1])
            if isinstance(obj.get("t"), (int, float)):
                with self._lock:
                    self._latency_ms = round((time.time() - obj["t"]) * 1000, 3)
            if self._check_epoch(sock, obj.get("epoch")) or not obj.get("known"):
                self._hello(sock)          # a relay that does not know us yet
            for node in obj.get("peers") or []:
                if isinstance(node, str) and node != self.node_id:
                    self._touch_peer(node)
        elif kind == P.WELCOME and len(frames) == 2:
            obj = orjson.loads(frames[1])
            self._check_epoch(sock, obj.get("epoch"))
            self._set_connected(True)
            self._subscribe(sock)
            self._retry(sock, now)
        elif kind == P.SUBOK and len(frames) == 3:
            obj = orjson.loads(frames[2])
            if obj.get("epoch") == self._epoch and isinstance(obj.get("next_seq"), int):
                self._replay_until = obj["next_seq"] - 1   # deliveries up to here were buffered

    def _check_epoch(self, sock: zmq.Socket, epoch) -> bool:
        """Adopt the relay's epoch; True when it changed (the caller registers again)."""
        if not isinstance(epoch, str) or epoch == self._epoch:
            return False
        restarted = self._epoch is not None
        self._epoch = epoch
        self._last_seq = 0
        if restarted:
            # A new relay instance: it knows nothing of us. Register again and re-publish
            # what the old one acknowledged (receivers drop the copies they already have).
            log.warning("relay restarted (epoch %s): re-publishing %d acked rollouts", epoch, len(self._acked))
            with self._lock:
                self._stats["relay_restarts"] += 1
            self._set_connected(False)
            now = time.monotonic()
            self._trim_acked(now)
            for rid, (_, payload, origin) in self._acked.items():
                if rid not in self._pending:
                    self._pending[rid] = _Outgoing(rid, payload, origin=origin)
                    with self._lock:
                        self._n_pending += 1
                        self._stats["republished"] += 1
            self._acked.clear()
        return True

    def _trim_acked(self, now: float) -> None:
        while self._acked and (len(self._acked) > self.keep_acked_max or
                               now - next(iter(self._acked.values()))[0] > self.keep_acked_s):
            self._acked.popitem(last=False)

    def _on_nack(self, sock: zmq.Socket, rid: bytes, reason: str, now: float) -> None:
        if reason == "hello_first":
            # The relay does not know us (it restarted, or forgot us): register again; the
            # rollout stays pending and is re-sent after the WELCOME.
            self._set_connected(False)
            self._hello(sock)
            return
        with self._lock:
            self._nacked[reason] += 1
        out = self._pending.get(rid)
        if out is None:
            return
        if reason == "rate_limited":
            out.not_before = now + min(0.2 * 2 ** min(out.attempts, 5), 5.0)
            out.last_sent = 0.0
            return
        del self._pending[rid]        # refused for good: counted, not retried
        with self._lock:
            self._n_pending -= 1

    def _on_deliver(self, frames: list[bytes]) -> None:
        try:
            seq, topic, epoch, sender_b, rid, payload = P.unpack_deliver(frames[1])
        except ValueError:
            return
        gap = 0
        if epoch.decode(errors="replace") == self._epoch:
            if self._last_seq and seq > self._last_seq + 1:
                gap = seq - self._last_seq - 1
            self._last_seq = max(self._last_seq, seq)
        sender = sender_b.decode(errors="replace")
        duplicate = rid in self._seen
        if sender == self.node_id or duplicate:
            with self._lock:
                self._stats["bytes_in"] += len(payload)
                self._stats["gaps"] += gap
                self._stats["duplicates"] += duplicate
            return
        self._seen[rid] = None
        if len(self._seen) > self._dedup_max:
            self._seen.popitem(last=False)
        error, rollout = None, None
        if self.decode:
            try:
                rollout = wire.decode(payload, self.limits)
                if rollout.node_id != sender:
                    raise WireError("sender_mismatch", f"rollout claims node {rollout.node_id!r}, "
                                                       f"relay says it came from {sender!r}")
                if rollout.rollout_id.encode() != rid:
                    raise WireError("bad_header", "rollout id differs from the relay's")
            except WireError as e:
                error, rollout = e, None
        now = time.time()
        item = Received(rollout, sender, len(payload), error, seq, topic.decode(errors="replace"),
                        received_at=now, rollout_id=rid.decode(errors="replace"),
                        payload=None if self.decode else payload)
        with self._lock:                      # one critical section per delivery
            st = self._stats
            st["bytes_in"] += len(payload)
            st["gaps"] += gap
            st["received"] += 1
            st["decode_errors"] += error is not None
            st["replayed"] += seq <= self._replay_until
            p = self._peers.get(sender)
            if p is None:
                p = self._peers[sender] = {"last_seen": now, "rollouts": 0}
            p["last_seen"] = now
            p["rollouts"] += 1
        with self._inbox_cv:
            if len(self._inbox) == self._inbox.maxlen:    # the node is not polling: oldest goes
                with self._lock:
                    self._stats["inbox_dropped"] += 1
            self._inbox.append(item)
            self._inbox_cv.notify_all()

    def _touch_peer(self, node: str, rollout: bool = False) -> None:
        with self._lock:
            p = self._peers.setdefault(node, {"last_seen": 0.0, "rollouts": 0})
            p["last_seen"] = time.time()
            p["rollouts"] += int(rollout)


def default_node_id() -> str:
    """A readable, probably unique node id: host name + 4 random bytes."""
    host = os.uname().nodename.split(".")[0][:32] if hasattr(os, "uname") else "node"
    return f"{host}-{os.urandom(4).hex()}"
