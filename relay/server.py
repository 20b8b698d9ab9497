"""The relay: one ROUTER socket, per-topic sequence numbers and replay buffers, honest acks,
deduplication, rate limits, delivery budgets and bounded, non-blocking fan-out.

It imports `relay.protocol` (and `relay.keys` for CURVE) and nothing of the node: it runs
with pyzmq + orjson only.

Fan-out never blocks: the relay keeps, per subscriber and topic, a cursor into the topic's
replay buffer and sends with NOBLOCK on a ROUTER_MANDATORY socket. When a subscriber's pipe
is full the send fails with EAGAIN, its cursor stops, and it catches up from the buffer later.

An ACK is a promise (docs/relay.md, "Delivery guarantees"): the rollout will be offered to
every live subscriber whose budget and filters want it. So the relay never evicts from a
topic's buffer an entry that an everything-subscriber which keeps up has not been sent yet;
when the buffer is full of such entries it answers `NACK busy` with a retry-after instead of
ACKing what it would skip. A subscriber whose pipe stays full for `slow_after_s` while another
subscriber's is not no longer holds the buffer: it skips ahead when it falls behind, and the
skips are counted.
"""
from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import orjson
import zmq

from relay import protocol as P

log = logging.getLogger("ftis-relay")
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_LAST = int(zmq.NOBLOCK)


@dataclass
class RelayConfig:
    bind: str = "tcp://0.0.0.0:5555"
    keys_dir: str | None = None            # server certificate (server.key_secret)
    allow_dir: str | None = None           # allowed client public certificates; NAME.key may be node NAME
    replay_count: int = 2048               # per topic
    replay_bytes: int = 64 << 20           # per topic
    max_message_bytes: int = P.MAX_ROLLOUT_BYTES   # one rollout
    rate_msgs: float = 50.0                # per connection and per node id (key), rollouts/s (0 = unlimited)
    rate_burst: float = 200.0
    rate_bytes: float = 8 << 20            # per connection and per node id (key), bytes/s (0 = unlimited)
    accept_rate: float = 5000.0            # all publishers together, rollouts/s (0 = unlimited)
    accept_burst: float = 10000.0
    dedup_size: int = 200_000              # remembered rollout ids
    peer_timeout_s: float = 15.0           # forget a silent client after this
    heartbeat_s: float = 1.0               # advertised client ping interval
    sndhwm: int = 1000                     # messages queued per client pipe
    pump_batch: int = 256                  # deliveries per subscriber per loop turn
    max_peers: int = 10_000                # HELLO floods on an open relay cannot exhaust memory
    max_topics: int = 64                   # topics in total (each holds up to replay_bytes)
    max_topics_per_peer: int = 4           # topics one connection may publish or subscribe to
    slow_after_s: float = 2.0              # a subscriber whose pipe stays full this long stops holding the buffer
    busy_retry_s: float = 0.25             # retry-after sent with NACK busy
    gather_s: float = 0.2                  # budgets: collect candidates this long before a fair pick
    trusted_bridges: frozenset = frozenset()   # node ids (key names on CURVE) allowed to forward others' rollouts


class TokenBucket:
    """rate tokens/s, up to burst; rate 0 means unlimited."""

    __slots__ = ("rate", "burst", "tokens", "t")

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, time.monotonic()

    def refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now

    def take(self, n: float = 1.0, now: float | None = None) -> bool:
        if self.rate <= 0:
            return True
        self.refill(time.monotonic() if now is None else now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


@dataclass
class Entry:
    seq: int
    rollout_id: bytes
    sender_rid: bytes
    sender: bytes          # node id
    size: int              # payload bytes
    body: bytes            # the DELIVER frame (metadata + payload), built once for all subscribers
    t: float               # accepted at (monotonic)
    task: str | None
    tok: str | None


class Topic:
    """Sequence numbers and a bounded replay buffer (by count and by bytes)."""

    def __init__(self, name: bytes, max_count: int, max_bytes: int, epoch: bytes):
        self.name, self.epoch = name, epoch
        self.entries: dict[int, Entry] = {}
        self.first_seq = 1
        self.next_seq = 1
        self.nbytes = 0
        self.max_count, self.max_bytes = max_count, max_bytes
        self.subscribers: set[bytes] = set()
        self.hold_seq: int | None = None          # lowest cursor of subscribers that hold the buffer
        self.senders: dict[bytes, float] = {}     # sender -> last accepted (monotonic), for budgets
        self._active = (0.0, 0.0, 0)              # (computed at, window, count) cache

    def room_for(self, size: int) -> bool:
        """True when appending `size` bytes evicts nothing a holding subscriber still needs."""
        count, nbytes, first = len(self.entries), self.nbytes, self.first_seq
        while count and (count + 1 > self.max_count or nbytes + size > self.max_bytes):
            if self.hold_seq is not None and first >= self.hold_seq:
                return False
            nbytes -= self.entries[first].size
            first += 1
            count -= 1
        return True

    def append(self, e_rid: bytes, sender_rid: bytes, sender: bytes, payload: bytes, attrs: bytes,
               task: str | None, tok: str | None, now: float) -> int:
        seq = self.next_seq
        self.entries[seq] = Entry(seq, e_rid, sender_rid, sender, len(payload),
                                  P.pack_deliver(seq, self.name, self.epoch, sender, e_rid, attrs, payload),
                                  now, task, tok)
        self.next_seq += 1
        self.nbytes += len(payload)
        self.senders[sender] = now
        while self.entries and (len(self.entries) > self.max_count or self.nbytes > self.max_bytes):
            old = self.entries.pop(self.first_seq)
            self.nbytes -= old.size
            self.first_seq += 1
        return seq

    def active_senders(self, now: float, window_s: float) -> int:
        """Publishers heard from within window_s (cached for 0.5 s: asked once per pump)."""
        at, w, n = self._active
        if now - at > 0.5 or w != window_s:
            n = sum(1 for t in self.senders.values() if now - t <= window_s)
            self._active = (now, window_s, n)
        return n


@dataclass
class Budget:
    """A subscriber's delivery budget on one topic: at most k rollouts per window_s, at most
    a fair share per publisher, newest first, from rollouts not older than one window."""

    k: int
    window_s: float
    window_start: float = 0.0
    pick_at: float = 0.0      # candidates gather until then, so a pick sees every publisher
    sent: int = 0
    served: collections.Counter = field(default_factory=collections.Counter)   # sender -> this window
    candidates: dict = field(default_factory=dict)      # sender -> its <= 2 newest unsent seqs


@dataclass
class Peer:
    rid: bytes
    node_id: bytes = b""
    key_name: str | None = None            # CURVE: the allow-list certificate name (= the node id)
    address: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    cursors: dict[bytes, int] = field(default_factory=dict)   # topic -> next seq to look at
    budgets: dict[bytes, Budget] = field(default_factory=dict)  # topic -> budget (absent = everything)
    filters: dict[bytes, dict] = field(default_factory=dict)    # topic -> {"task": set, "tok": set}
    topics: set = field(default_factory=set)                  # topics used (pub or sub)
    in_msgs: int = 0
    in_bytes: int = 0
    out_msgs: int = 0
    out_bytes: int = 0
    acked: int = 0
    nacked: int = 0
    skipped: int = 0          # rollouts it missed because it fell behind the replay buffer
    blocked_since: float | None = None    # its pipe has been full since (monotonic)
    last_accept: float = 0.0


class _Auth:
    """ZAP for CURVE: the allow-list maps each public key to its certificate's name, which
    becomes the connection's User-Id; refused handshakes are counted and logged at INFO."""

    def __init__(self, ctx: zmq.Context, allow_dir: str, refused: collections.Counter):
        from zmq.auth.thread import ThreadAuthenticator
        from zmq.utils import z85
        from relay.keys import allowed_names
        names = allowed_names(allow_dir)
        alog = logging.getLogger("ftis-relay.auth")

        class Authenticator(ThreadAuthenticator):
            address = ""

            async def handle_zap_message(self, msg):
                self.address = msg[3].decode(errors="replace") if len(msg) > 3 else "?"
                await super().handle_zap_message(msg)

            async def _authenticate_curve(self, domain, client_key):
                if client_key in names:
                    return True, b"OK"
                refused["unknown_key"] += 1
                alog.info("refused CURVE handshake from %s: key %s is not in the allow list",
                          self.address, z85.encode(client_key).decode())
                return False, b"Unknown key"

            def curve_user_id(self, client_public_key):
                return names[client_public_key]

        self.names = names
        self.thread = Authenticator(ctx, log=logging.getLogger("ftis-relay.zap"))
        self.thread.start()

    def stop(self) -> None:
        self.thread.stop()


class Relay:
    def __init__(self, cfg: RelayConfig):
        self.cfg = cfg
        hint = P.check_bind(cfg.bind)
        if hint:
            raise ValueError(hint)
        self.epoch = os.urandom(8).hex().encode()
        self.started = time.time()
        self.ctx = zmq.Context()
        self.auth: _Auth | None = None
        self.refused_handshakes: collections.Counter[str] = collections.Counter()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, cfg.sndhwm)
        # per connection: a flood of many connections must not queue GBs inside the relay
        self.sock.setsockopt(zmq.RCVHWM, 256)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_bytes + P.FRAME_SLACK)
        self.monitor = None
        if cfg.keys_dir:
            self._setup_curve()
        self.sock.bind(cfg.bind)
        self.topics: dict[bytes, Topic] = {}
        self.peers: dict[bytes, Peer] = {}
        self.buckets: collections.OrderedDict[bytes, tuple[TokenBucket, TokenBucket]] = collections.OrderedDict()
        self.accept_bucket = TokenBucket(cfg.accept_rate, cfg.accept_burst)
        self.seen: collections.OrderedDict[bytes, tuple[bytes, int]] = collections.OrderedDict()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.running = False
        self._budget_waiting = False      # a budgeted subscriber gathers candidates: poll sooner
        self.delivered = self.delivered_bytes = 0     # all deliveries (plain ints: on the hot path)

    # -------------------------------------------------------------- setup
    def _setup_curve(self) -> None:
        from relay.keys import load_server_keys
        public, secret = load_server_keys(self.cfg.keys_dir)
        if not self.cfg.allow_dir:
            raise ValueError("--keys needs --allow DIR (the public certificates of allowed clients)")
        self.auth = _Auth(self.ctx, self.cfg.allow_dir, self.refused_handshakes)
        self.sock.curve_secretkey = secret
        self.sock.curve_publickey = public
        self.sock.curve_server = True
        # Handshakes that fail before ZAP (a client without keys, a wrong server key) show
        # only as monitor events.
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    @property
    def curve(self) -> bool:
        return self.auth is not None

    # -------------------------------------------------------------- loop
    def serve(self) -> None:
        """Run until stop() (or SIGINT / SIGTERM when installed by `run`)."""
        self.running = True
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.monitor is not None:
            poller.register(self.monitor, zmq.POLLIN)
        last_housekeeping = time.monotonic()
        log.info("relay epoch %s listening on %s (curve=%s)", self.epoch.decode(), self.cfg.bind, self.curve)
        while self.running:
            try:
                events = dict(poller.poll(5 if self._backlog() else 50 if self._budget_waiting else 200))
            except zmq.ZMQError as e:
                if e.errno == zmq.EINTR:
                    continue
                raise
            if self.sock in events:
                for _ in range(2000):          # drain, but bounded so fan-out gets its turn
                    if not self.running:
                        break
                    try:
                        frames, user_id, address = self._recv()
                    except zmq.Again:
                        break
                    try:
                        self._handle(frames, user_id, address)
                    except Exception:          # never crash on input
                        self.rejected["internal"] += 1
                        log.exception("handler failed")
            if self.monitor is not None and self.monitor in events:
                self._on_monitor()
            self._pump_all()
            now = time.monotonic()
            if now - last_housekeeping > 1.0:
                last_housekeeping = now
                self._expire_peers(now)

    def _recv(self) -> tuple[list[bytes], str | None, str]:
        if not self.curve:
            return self.sock.recv_multipart(zmq.NOBLOCK), None, ""
        # On CURVE the key's name travels as the message's User-Id (set by our ZAP handler).
        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
        user_id = address = None
        if len(frames) > 1 and frames[1].bytes == P.HELLO:
            user_id = frames[1].get("User-Id")
            address = frames[1].get("Peer-Address")
        return [f.bytes for f in frames], user_id, address or ""

    def _on_monitor(self) -> None:
        from zmq.utils.monitor import recv_monitor_message
        while True:
            try:
                ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.refused_handshakes["aborted"] += 1      # the client hung up mid-handshake (which side
                # notices a mechanism mismatch first is a race: a client without keys shows as either)
                log.info("handshake aborted by a client on %s: a client without CURVE keys, or with a "
                         "wrong server key? (errno %s)", ev["endpoint"].decode(errors="replace"), ev["value"])
                continue
            reason = ("no_curve" if ev["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                      else "bad_handshake")
            self.refused_handshakes[reason] += 1
            # libzmq's monitor names our endpoint, not the client's; ZAP (unknown keys) has both
            log.info("refused handshake on %s: %s (protocol error %#x)", ev["endpoint"].decode(errors="replace"),
                     "the client has no CURVE keys" if reason == "no_curve"
                     else "CURVE failed (wrong server key?)", ev["value"])

    def stop(self) -> None:
        self.running = False

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(0)
        self.sock.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()

    # -------------------------------------------------------------- handlers
    def _handle(self, frames: list[bytes], user_id: str | None, address: str) -> None:
        if len(frames) < 2:
            self.rejected["bad_frame"] += 1
            return
        rid, kind, args = frames[0], frames[1], frames[2:]
        peer = self.peers.get(rid)
        if peer is not None:
            peer.last_seen = time.monotonic()
            peer.in_msgs += 1
            peer.in_bytes += sum(len(f) for f in args)
        if kind == P.PUB:
            self._on_pub(rid, peer, args)
        elif kind == P.PING:
            self._on_ping(rid, peer, args)
        elif kind == P.HELLO:
            self._on_hello(rid, args, user_id, address)
        elif kind == P.SUB:
            self._on_sub(rid, peer, args)
        elif kind == P.STATS:
            self._send(rid, [P.STATS, orjson.dumps(self.stats())])
        elif kind == P.BYE:
            self._drop_peer(rid)
        else:
            self.rejected["bad_frame"] += 1

    def _control(self, args: list[bytes], n: int) -> dict | None:
        """Parse a control message with n frames whose last one is a small JSON object."""
        if len(args) != n or len(args[-1]) > P.MAX_CONTROL_BYTES:
            self.rejected["bad_frame"] += 1
            return None
        try:
            obj = orjson.loads(args[-1])
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            self.rejected["bad_frame"] += 1
            return None
        return obj

    def _refuse_hello(self, rid: bytes, reason: str, detail: str = "") -> None:
        self.rejected[reason] += 1
        self._send(rid, [P.NACK, b"", reason.encode()] + ([orjson.dumps({"detail": detail})] if detail else []))

    def _on_hello(self, rid: bytes, args: list[bytes], user_id: str | None, address: str) -> None:
        obj = self._control(args, 1)
        if obj is None:
            return
        node_id = obj.get("node_id")
        if not isinstance(node_id, str) or not 0 < len(node_id.encode()) <= P.MAX_NODE_ID_LEN:
            self._refuse_hello(rid, "bad_hello")
            return
        if obj.get("protocol") != P.RELAY_PROTOCOL:
            self._refuse_hello(rid, "bad_version", f"relay protocol {P.RELAY_PROTOCOL}")
            return
        if self.curve and node_id != user_id:
            # The key is the identity: its certificate's name is the only node id it may use.
            log.info("refused HELLO as %r from %s: its key is named %r", node_id, address or "?", user_id)
            self._refuse_hello(rid, P.IDENTITY, f"this key may only connect as {user_id!r}")
            return
        peer = self.peers.get(rid)
        if peer is None and len(self.peers) >= self.cfg.max_peers:
            self._refuse_hello(rid, "too_many_peers")
            return
        peer = peer or Peer(rid)
        if peer.node_id and peer.node_id != node_id.encode():
            self.counts["renamed"] += 1         # ids are claims on an open relay; limits stay per connection
        peer.node_id = node_id.encode()
        peer.key_name = user_id
        peer.address = address
        peer.last_seen = time.monotonic()
        self.peers[rid] = peer
        self.counts["hello"] += 1
        self._send(rid, [P.WELCOME, orjson.dumps({"epoch": self.epoch.decode(), "heartbeat_s": self.cfg.heartbeat_s,
                                                  "identity": "key" if self.curve else "claimed"})])

    def _use_topic(self, rid: bytes, peer: Peer, name: bytes) -> Topic | str:
        """The topic, or the NACK reason why this connection may not use it."""
        if not 0 < len(name) <= P.MAX_TOPIC_LEN:
            return "bad_topic"
        if name not in peer.topics and len(peer.topics) >= self.cfg.max_topics_per_peer:
            return "too_many_topics"
        t = self.topics.get(name)
        if t is None:
            if len(self.topics) >= self.cfg.max_topics:
                return "too_many_topics"
            t = self.topics[name] = Topic(name, self.cfg.replay_count, self.cfg.replay_bytes, self.epoch)
        peer.topics.add(name)
        return t

    def _on_sub(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        if peer is None:
            self._send(rid, [P.NACK, b"", P.HELLO_FIRST.encode()])
            return
        obj = self._control(args, 2)
        if obj is None:
            return
        topic = self._use_topic(rid, peer, args[0])
        if isinstance(topic, str):
            self.rejected[topic] += 1
            self._send(rid, [P.NACK, b"", topic.encode()])
            return
        last_seq = obj.get("last_seq", 0)
        if not isinstance(last_seq, int) or last_seq < 0 or obj.get("epoch") != self.epoch.decode():
            last_seq = 0       # another epoch's sequence numbers mean nothing here
        budget = obj.get("budget")
        peer.budgets.pop(topic.name, None)
        if isinstance(budget, dict) and isinstance(budget.get("k"), int) and budget["k"] > 0:
            w = budget.get("window_s")
            w = float(w) if isinstance(w, (int, float)) and 0.1 <= w <= 3600 else 10.0
            peer.budgets[topic.name] = Budget(min(budget["k"], 10_000), w)
        filters = obj.get("filters")
        peer.filters.pop(topic.name, None)
        if isinstance(filters, dict):
            f = {k: {v for v in vals if isinstance(v, str)} for k, vals in filters.items()
                 if k in ("task", "tok") and isinstance(vals, list) and vals}
            if f:
                peer.filters[topic.name] = f
        topic.subscribers.add(rid)
        peer.cursors[topic.name] = max(last_seq + 1, topic.first_seq)
        self._update_hold(topic, time.monotonic())
        b = peer.budgets.get(topic.name)
        self._send(rid, [P.SUBOK, topic.name, orjson.dumps({
            "epoch": self.epoch.decode(), "first_seq": topic.first_seq, "next_seq": topic.next_seq,
            "budget": {"k": b.k, "window_s": b.window_s} if b else None})])

    def _on_ping(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        obj = self._control(args, 1)
        if obj is None:
            return
        reply = {"t": obj.get("t"), "epoch": self.epoch.decode(), "known": peer is not None}
        if peer is not None:
            reply["peers"] = [p.node_id.decode(errors="replace") for p in self.peers.values() if p.node_id]
        self._send(rid, [P.PONG, orjson.dumps(reply)])

    def _nack(self, rid: bytes, peer: Peer | None, rollout_id: bytes, reason: str,
              retry_after_s: float | None = None) -> None:
        self.rejected[reason] += 1
        if peer is not None:
            peer.nacked += 1
        frames = [P.NACK, rollout_id, reason.encode()]
        if retry_after_s is not None:
            frames.append(orjson.dumps({"retry_after_s": retry_after_s}))
        self._send(rid, frames)

    def _attrs(self, raw: bytes) -> dict | None:
        if len(raw) > P.MAX_ATTRS_BYTES:
            return None
        try:
            a = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(a, dict):
            return None
        for k in ("origin", "task", "tok"):
            v = a.get(k)
            if v is not None and not (isinstance(v, str) and 0 < len(v.encode()) <= P.MAX_NODE_ID_LEN):
                return None
        via = a.get("via", [])
        if not (isinstance(via, list) and len(via) < P.MAX_VIA and all(isinstance(v, str) for v in via)):
            return None
        return a

    def _bucket(self, key: bytes) -> tuple[TokenBucket, TokenBucket]:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = (
                TokenBucket(self.cfg.rate_msgs, self.cfg.rate_burst),
                TokenBucket(self.cfg.rate_bytes, max(self.cfg.rate_bytes * 2, self.cfg.max_message_bytes)))
            if len(self.buckets) > 4 * self.cfg.max_peers:
                self.buckets.popitem(last=False)
        return b

    def _on_pub(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        if len(args) not in (2, 3):
            self._nack(rid, peer, b"", "bad_frame")
            return
        topic_name, payload = args[0], args[1]
        if peer is None:
            self._nack(rid, peer, b"", P.HELLO_FIRST)
            return
        sender, attrs = peer.node_id, {}
        if len(args) == 3:
            attrs = self._attrs(args[2])
            if attrs is None:
                self._nack(rid, peer, b"", "bad_frame")
                return
        bridged = "origin" in attrs          # a federation bridge forwarding another node's rollout
        if bridged:
            if peer.node_id.decode(errors="replace") not in self.cfg.trusted_bridges:
                self._nack(rid, peer, b"", "untrusted_bridge")
                return
            sender = attrs.pop("origin").encode()
        via = attrs.get("via", [])
        if self.epoch.decode() in via:        # it was here already: a federation loop
            self._nack(rid, peer, b"", "loop")
            return
        if len(payload) > self.cfg.max_message_bytes:
            self._nack(rid, peer, b"", "too_large")
            return
        try:
            pk = P.peek_rollout(payload, self.cfg.max_message_bytes)
        except P.PrefixError as e:
            self._nack(rid, peer, b"", e.reason)
            return
        rollout_id = pk.rollout_id.encode()
        known = self.seen.get(rollout_id)
        if known is not None:        # a resend after a lost ACK (or a bridge's copy): ACK again, deliver once
            self.counts["duplicate"] += 1
            self._send(rid, [P.ACK, rollout_id, P.pack_seq(known[1]), self.epoch])
            return
        topic = self._use_topic(rid, peer, topic_name)
        if isinstance(topic, str):
            self._nack(rid, peer, b"", topic)
            return
        now = time.monotonic()
        if not bridged:
            for key in (b"c" + rid, b"n" + peer.node_id):       # per connection, per node id (= key on CURVE)
                msgs, nbytes = self._bucket(key)
                if not (msgs.take(1.0, now) and nbytes.take(len(payload), now)):
                    self._nack(rid, peer, rollout_id, "rate_limited",
                               round(max(0.05, 1.0 / max(self.cfg.rate_msgs, 1e-3)), 3))
                    return
            # The global budget; a connection that had nothing accepted for a second still
            # gets one through, so a flood of many connections cannot starve a quiet node.
            if not self.accept_bucket.take(1.0, now) and now - peer.last_accept < 1.0:
                self._nack(rid, peer, rollout_id, "busy", self.cfg.busy_retry_s)
                return
        if not topic.room_for(len(payload)):
            self._nack(rid, peer, rollout_id, "busy", self.cfg.busy_retry_s)
            return
        via.append(self.epoch.decode())
        attrs["via"] = via
        seq = topic.append(rollout_id, rid, sender, payload, orjson.dumps(attrs), attrs.get("task"),
                           attrs.get("tok"), now)
        self.seen[rollout_id] = (topic_name, seq)
        if len(self.seen) > self.cfg.dedup_size:
            self.seen.popitem(last=False)
        peer.acked += 1
        peer.last_accept = now
        self.counts["accepted"] += 1
        self._send(rid, [P.ACK, rollout_id, P.pack_seq(seq), self.epoch])

    # -------------------------------------------------------------- fan-out
    def _send(self, rid: bytes, frames: list[bytes]) -> bool:
        """Non-blocking send; False when the client's pipe is full or it is gone.

        Frame by frame with plain-int flags: send_multipart's per-frame enum arithmetic was
        a third of the relay's CPU time in profiles. With ROUTER_MANDATORY a full pipe
        raises EAGAIN on the routing-id frame, before anything is queued."""
        send = self.sock.send
        try:
            send(rid, _MORE)
            for f in frames[:-1]:
                send(f, _MORE)
            send(frames[-1], _LAST)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._drop_peer(rid)
                return False
            raise

    def _backlog(self) -> bool:
        for t in self.topics.values():
            for rid in t.subscribers:
                peer = self.peers.get(rid)
                if peer is not None and peer.cursors.get(t.name, t.next_seq) < t.next_seq \
                        and peer.blocked_since is None:
                    return True
        return False

    def _update_hold(self, topic: Topic, now: float) -> None:
        """The lowest cursor among everything-subscribers that keep up: the buffer may not
        evict from there on (so ACKs stay honest; see the module docstring).

        A subscriber stops holding when its pipe has been full for slow_after_s while another
        subscriber's is not: then it is the one that is slow, not the relay (under a flood the
        relay's own I/O can stall every pipe at once, and that must not count). A frozen lone
        subscriber stops pinging and is dropped after peer_timeout_s."""
        subs = [p for rid in topic.subscribers if (p := self.peers.get(rid)) is not None]
        flowing = any(p.blocked_since is None for p in subs)
        hold = None
        for p in subs:
            if topic.name in p.budgets:
                continue
            b = p.blocked_since
            if b is not None and now - b >= self.cfg.slow_after_s and flowing:
                continue
            c = p.cursors.get(topic.name, topic.next_seq)
            hold = c if hold is None else min(hold, c)
        topic.hold_seq = hold

    def _pump_all(self) -> None:
        now = time.monotonic()
        self._budget_waiting = False
        for topic in self.topics.values():
            for rid in list(topic.subscribers):
                peer = self.peers.get(rid)
                if peer is None:
                    topic.subscribers.discard(rid)
                    continue
                b = peer.budgets.get(topic.name)
                if b is None:
                    self._pump(peer, topic, now)
                else:
                    self._pump_budget(peer, topic, b, now)
            self._update_hold(topic, now)

    def _wants(self, peer: Peer, topic: Topic, e: Entry) -> bool:
        if e.sender == peer.node_id or e.sender_rid == peer.rid:   # never echo back
            return False
        f = peer.filters.get(topic.name)
        # An untagged rollout passes (a publisher that does not tag is not filtered out; the
        # receiver validates every field anyway); a tagged one must match.
        if f is not None and ((e.task is not None and "task" in f and e.task not in f["task"])
                              or (e.tok is not None and "tok" in f and e.tok not in f["tok"])):
            return False
        return True

    def _deliver(self, peer: Peer, e: Entry, now: float) -> bool:
        if not self._send(peer.rid, [P.DELIVER, e.body]):
            if peer.blocked_since is None:
                peer.blocked_since = now
            return False
        peer.blocked_since = None
        peer.out_msgs += 1
        peer.out_bytes += e.size
        self.delivered += 1
        self.delivered_bytes += e.size
        return True

    def _pump(self, peer: Peer, topic: Topic, now: float) -> None:
        cur = peer.cursors.get(topic.name, topic.next_seq)
        if cur < topic.first_seq:           # fell behind the replay buffer (it was slow, not holding)
            peer.skipped += topic.first_seq - cur
            self.counts["skipped_slow"] += topic.first_seq - cur
            cur = topic.first_seq
        sent = 0
        entries = topic.entries
        while cur < topic.next_seq and sent < self.cfg.pump_batch:
            e = entries[cur]
            if self._wants(peer, topic, e):
                if not self._deliver(peer, e, now):
                    break
                sent += 1
            cur += 1
        peer.cursors[topic.name] = cur

    def _pump_budget(self, peer: Peer, topic: Topic, b: Budget, now: float) -> None:
        """Offer at most k rollouts per window: each publisher's two newest not-yet-sent
        rollouts are candidates while younger than one window (the learner takes the newest
        <= 2 per peer); picks go to the most recently
        active publisher that is below its fair share (k / active publishers) this window."""
        if now - b.window_start >= b.window_s:
            b.window_start, b.sent, b.pick_at = now, 0, 0.0
            b.served.clear()
        cur = max(peer.cursors.get(topic.name, topic.next_seq), topic.first_seq)
        entries, cands = topic.entries, b.candidates
        cap = max(8 * b.k, 32)      # picks take the most recently active first: older ones can go
        while cur < topic.next_seq:
            e = entries[cur]
            if self._wants(peer, topic, e):
                newest = cands.pop(e.sender, None) or []   # re-insert: dict order = latest activity
                newest.append(cur)
                cands[e.sender] = newest[-2:]
                if len(cands) > cap:                   # memory O(subscribers x cap), not O(N^2)
                    del cands[next(iter(cands))]
            cur += 1
        peer.cursors[topic.name] = cur
        if b.sent >= b.k or not cands:
            return
        if b.pick_at == 0.0:
            b.pick_at = now + self.cfg.gather_s      # first candidates of this window: gather
        if now < b.pick_at:
            self._budget_waiting = True
            return
        share = max(1, -(-b.k // max(1, topic.active_senders(now, b.window_s))))
        stale = now - b.window_s
        while b.sent < b.k:
            best, best_n, gone = None, share, []
            for sender in reversed(cands):          # newest activity first: low latency
                e = entries.get(cands[sender][-1])
                if e is None or e.t < stale:        # the newest is gone or stale: so is the older
                    gone.append(sender)
                    continue
                n = b.served[sender]
                if n < best_n:
                    best, best_n = sender, n
                    if n == 0:
                        break
            for sender in gone:
                del cands[sender]
            if best is None:
                return
            newest = cands[best]
            if not self._deliver(peer, entries[newest[-1]], now):
                return
            newest.pop()
            if not newest:
                del cands[best]
            b.served[best] += 1
            b.sent += 1
            self.counts["budget_sent"] += 1

    def _drop_peer(self, rid: bytes) -> None:
        self.peers.pop(rid, None)
        self.buckets.pop(b"c" + rid, None)
        for t in self.topics.values():
            if rid in t.subscribers:
                t.subscribers.discard(rid)
                self._update_hold(t, time.monotonic())

    def _expire_peers(self, now: float) -> None:
        for rid, p in list(self.peers.items()):
            if now - p.last_seen > self.cfg.peer_timeout_s:
                log.info("peer %s timed out", p.node_id.decode(errors="replace"))
                self._drop_peer(rid)
        for t in self.topics.values():      # forget publishers silent for a long time (budget fairness)
            for s in [s for s, at in t.senders.items() if now - at > 3600]:
                del t.senders[s]

    # -------------------------------------------------------------- stats
    def stats(self) -> dict:
        now = time.monotonic()
        return {
            "epoch": self.epoch.decode(),
            "uptime_s": round(time.time() - self.started, 1),
            "bind": self.cfg.bind,
            "curve": self.curve,
            "identity": ("key: a node id is the name of its allow-list certificate" if self.curve else
                         "claimed: open relay, node ids are not verified (use --keys/--allow to bind them to keys)"),
            "peers": [{
                "node_id": p.node_id.decode(errors="replace"),
                "key": p.key_name,
                "topics": [t.decode(errors="replace") for t in p.cursors],
                "budget": {t.decode(errors="replace"): {"k": b.k, "window_s": b.window_s}
                           for t, b in p.budgets.items()},
                "last_seen_s": round(now - p.last_seen, 2),
                "in_msgs": p.in_msgs, "in_bytes": p.in_bytes,
                "out_msgs": p.out_msgs, "out_bytes": p.out_bytes,
                "acked": p.acked, "nacked": p.nacked, "skipped": p.skipped,
                "lag": sum(self.topics[t].next_seq - c for t, c in p.cursors.items()
                           if t in self.topics and t not in p.budgets),
                "blocked": p.blocked_since is not None,
            } for p in self.peers.values()],
            "topics": {t.name.decode(errors="replace"): {
                "next_seq": t.next_seq, "buffered": len(t.entries), "buffer_bytes": t.nbytes,
                "subscribers": len(t.subscribers)} for t in self.topics.values()},
            "rejected": dict(self.rejected),
            "refused_handshakes": dict(self.refused_handshakes),
            "counts": {**self.counts, "delivered": self.delivered, "delivered_bytes": self.delivered_bytes},
        }


def run(cfg: RelayConfig) -> int:
    """Run a relay in the foreground; SIGINT/SIGTERM stop it cleanly (exit code 0) within
    a second or two in every state."""
    relay = Relay(cfg)

    def _stop(signum, _frame):
        relay.stop()
        # The loop notices within one poll (<= 0.2 s). Should the process be stuck anywhere
        # else (a log write into a full pipe nobody reads, a hung ZeroMQ teardown), a
        # watchdog ends it: an orphaned relay must never need SIGKILL.
        threading.Thread(target=_exit_later, args=(1.5,), daemon=True).start()
        log.info("signal %d: shutting down", signum)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        relay.serve()
    finally:
        s = relay.stats()
        log.info("relay stopped after %.0f s: %d accepted, rejected %s", s["uptime_s"],
                 s["counts"].get("accepted", 0), s["rejected"])
        relay.close()
    return 0


def _exit_later(delay_s: float) -> None:
    time.sleep(delay_s)
    os._exit(0)
