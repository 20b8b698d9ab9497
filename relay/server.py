"""The relay: one ROUTER socket, per-topic sequence numbers and replay buffers, honest acks,
deduplication, rate limits, delivery budgets and bounded, non-blocking fan-out.

It imports `relay.protocol` (and `relay.keys` for CURVE) and nothing of the node: it runs
with pyzmq + orjson only. What touches no socket lives beside it: the replay buffer and the
candidate indexes (`relay.topic`), the budget and fair-share rules (`relay.budget`), token
buckets and the accept budget (`relay.limits`), the CURVE allow-list (`relay.auth`). This
module keeps the loop, the handlers and the hot fan-out path.

Fan-out never blocks: the relay keeps, per subscriber and topic, a cursor into the topic's
replay buffer and sends with NOBLOCK on a ROUTER_MANDATORY socket. When a subscriber's pipe
is full the send fails with EAGAIN, its cursor stops, and it catches up from the buffer later.
Budgeted subscribers have no cursor pump: they pick from a per-topic, per-filter-set `Index`
of each publisher's newest rollouts and are visited only when a timer, a full pipe, or a new
rollout while they have budget left concerns them (docs/relay.md, "Delivery budgets").

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
import heapq
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field

import orjson
import zmq

from relay import protocol as P
from relay.auth import AllowList, ZapAuth, identity_refusal, note_failed_handshakes, origin_allowed
from relay.budget import Budget
from relay.config import RelayConfig
from relay.conn import cut, fd_of, identify, source_of
from relay.frames import LAST as _LAST, MORE as _MORE, send_frame
from relay.limits import AcceptBudget, RateLimits
from relay.loglimit import LineLimit
from relay.queued import Account, Queued, reply_bytes
from relay.stats_reply import StatsReply
from relay.text_safety import terminal_safe as _safe    # peer-chosen strings reach the operator's terminal
from relay.topic import Entry, Index, Topic, passes

log = logging.getLogger("ftis-relay")


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
    held: bool = False        # ... because it was refused room for its queued bytes (relay.queued)
    acct: Account = field(default_factory=Account)   # its queued bytes (relay.queued)
    conn: tuple = ()          # its connection (relay.conn.identify), to cut it when it is dropped


@dataclass(slots=True)
class _Pub:
    """One PUB on its way through the admission checks (Relay._on_pub): what each check found."""
    rid: bytes
    peer: Peer | None
    args: list
    topic_name: bytes = b""
    payload: bytes = b""
    sender: bytes = b""
    attrs: dict = field(default_factory=dict)
    bridged: bool = False
    via: list = field(default_factory=list)
    pk: object = None                      # the rollout's prefix (protocol.peek_rollout)
    rollout_id: bytes = b""
    seen_key: bytes = b""
    topic: Topic | None = None
    now: float = 0.0
    quiet: bool = False                    # within its accept share: may use the buffer's reserve


class Relay:
    def __init__(self, cfg: RelayConfig):
        self.cfg = cfg
        hint = P.check_bind(cfg.bind)
        if hint:
            raise ValueError(hint)
        if cfg.trusted_bridges and not cfg.keys_dir and not cfg.open_bridges:
            # On an open relay anyone may HELLO as the bridge's name: trusting it there trusts anyone.
            raise ValueError("--trust-bridge on an open relay trusts a claimed node id (anyone can HELLO as "
                             f"{sorted(cfg.trusted_bridges)[0]!r} and publish as any node): use CURVE "
                             "(--keys/--allow, the name is then a key's), or pass --open-bridges to accept that")
        self.name = cfg.name or f"{socket.gethostname()}:{cfg.bind.rsplit(':', 1)[-1]}"
        if P.NAMESPACE in self.name or not 0 < len(self.name) <= 64 or not (self.name.isascii()
                                                                              and self.name.isprintable()):
            raise ValueError(f"relay name {self.name!r}: 1..64 printable ASCII characters without {P.NAMESPACE!r}")
        # --trust-bridge NAME (any other relay's namespace) or NAME=RELAY,RELAY (only those)
        self.bridges: dict[str, frozenset | None] = {}
        for t in cfg.trusted_bridges:
            bname, _, ns = t.partition("=")
            self.bridges[bname] = frozenset(filter(None, ns.split(","))) if ns else None
        self.epoch = os.urandom(8).hex().encode()
        self._epoch_s = self.epoch.decode()
        self.started = time.time()
        self.ctx = zmq.Context()
        self.auth: ZapAuth | None = None
        self.refused_handshakes: collections.Counter[str] = collections.Counter()
        self.refusal_lines = LineLimit()      # repeated refusal lines, per kind and peer: one per 10 s
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
        self.limits = RateLimits(cfg.rate_msgs, cfg.rate_burst, cfg.rate_bytes,
                                 max(cfg.rate_bytes * 2, cfg.max_message_bytes), 4 * cfg.max_peers)
        self.accept = AcceptBudget(cfg.accept_rate, cfg.accept_burst)
        # STATS, USEFUL per connection (keys b"s"/b"u" + routing id): 2/s, bursts of 4; PINGs twice that
        self.control_limits = RateLimits(P.CONTROL_RATE, P.CONTROL_BURST, 0.0, 0.0, 8 * cfg.max_peers)
        self.ping_limits = RateLimits(P.PING_RATE, P.PING_BURST, 0.0, 0.0, 4 * cfg.max_peers)
        self.seen: collections.OrderedDict[bytes, tuple[bytes, int]] = collections.OrderedDict()   # sender\0id -> (topic, seq)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.running = False
        # Budgeted subscribers are visited only when something concerns them: a timer (window
        # end, end of gathering), a new rollout in their index while they have budget left
        # (dirty indexes), or a full pipe to retry.
        self._timers: list[tuple[float, int, bytes, bytes]] = []   # (due, tiebreak, rid, topic)
        self._tick = itertools.count()
        self._dirty: set[tuple[bytes, tuple]] = set()              # (topic, index key)
        self._budget_retry: set[tuple[bytes, bytes]] = set()       # (rid, topic) whose pipe was full
        self.delivered = self.delivered_bytes = 0     # all deliveries (plain ints: on the hot path)
        self.readers: set[bytes] = set()              # subscribers that read: not full, sent > sndhwm
        # bytes handed to ZeroMQ and not proven read, per connection and in all (ghosts too)
        self.queued = Queued(cfg.max_queued_bytes, cfg.max_total_queued_bytes, cfg.max_message_bytes,
                             cfg.peer_timeout_s)
        self._stats_reply = StatsReply(self._stats_parts)
        self.askers: dict[bytes, float] = {}          # a key's connections that asked STATS without HELLO

    # -------------------------------------------------------------- setup
    def _setup_curve(self) -> None:
        from relay.keys import load_server_keys
        public, secret = load_server_keys(self.cfg.keys_dir)
        if not self.cfg.allow_dir:
            raise ValueError("--keys needs --allow DIR (the public certificates of allowed clients)")
        from relay.keys import allowed_names
        self.auth = ZapAuth(self.ctx, AllowList(allowed_names(self.cfg.allow_dir), self.refused_handshakes,
                                                self.refusal_lines))
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
                events = dict(poller.poll(5 if self._backlog() or self._budget_retry else self._timer_wait_ms()))
            except zmq.ZMQError as e:
                if e.errno == zmq.EINTR:
                    continue
                raise
            if self.sock in events:
                for _ in range(2000):          # drain, but bounded so fan-out gets its turn
                    if not self.running:
                        break
                    try:
                        frames, meta = self._recv()
                    except zmq.Again:
                        break
                    try:
                        self._handle(frames, meta)
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
                self._probe_ghosts()

    def _recv(self) -> tuple[list[bytes], tuple]:
        """(frames, meta); for a HELLO, meta is (key name on CURVE (the User-Id our ZAP handler
        set), peer address, the connection's fd (relay.conn)), else ()."""
        # frame by frame: recv_multipart asks getsockopt(RCVMORE) per frame, which builds an
        # enum each time; Frame.more does not
        recv = self.sock.recv
        f = recv(zmq.NOBLOCK, copy=False)
        frames, meta = [f.bytes], ()
        while f.more:
            f = recv(zmq.NOBLOCK, copy=False)
            frames.append(f.bytes)
            if len(frames) == 2 and frames[1] == P.HELLO:
                meta = (f.get("User-Id") if self.curve else None, f.get("Peer-Address") or "", fd_of(f))
        return frames, meta

    def _on_monitor(self) -> None:
        note_failed_handshakes(self.monitor, self.refused_handshakes, log, self.refusal_lines)

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
    def _handle(self, frames: list[bytes], meta: tuple) -> None:
        if len(frames) < 2:
            self.rejected["bad_frame"] += 1
            return
        rid, kind, args = frames[0], frames[1], frames[2:]
        peer = self.peers.get(rid)
        if peer is not None:
            peer.last_seen = time.monotonic()
            peer.in_msgs += 1
            peer.in_bytes += sum(map(len, args))
        if kind == P.PUB:
            self._on_pub(rid, peer, args)
        elif kind == P.PING:
            self._on_ping(rid, peer, args)
        elif kind == P.HELLO:
            self._on_hello(rid, args, *(meta or (None, "", None)))
        elif kind == P.SUB:
            self._on_sub(rid, peer, args)
        elif kind == P.STATS:
            self._on_stats(rid, peer)
        elif kind == P.USEFUL:
            self._on_useful(rid, peer, args)
        elif kind == P.BYE:
            a = self.queued.accounts.get(rid)
            obj = self._control(args, 1) if args else None
            if a is not None and obj is not None and isinstance(obj.get("mark"), str):
                self._receipt(a, obj["mark"])    # what it read before leaving is not a ghost's
            self._drop_peer(rid, why="said bye")
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

    def _on_hello(self, rid: bytes, args: list[bytes], user_id: str | None, address: str, fd: int | None) -> None:
        obj = self._control(args, 1)
        if obj is None:
            return
        node_id = obj.get("node_id")
        if not isinstance(node_id, str) or not 0 < len(node_id.encode()) <= P.MAX_NODE_ID_LEN:
            self._refuse_hello(rid, "bad_hello")
            return
        if P.NAMESPACE in node_id:
            self._refuse_hello(rid, "bad_hello", f"{P.NAMESPACE!r} is reserved for bridged ids (NODE{P.NAMESPACE}RELAY)")
            return
        if obj.get("protocol") != P.RELAY_PROTOCOL:
            self._refuse_hello(rid, "bad_version", f"relay protocol {P.RELAY_PROTOCOL}")
            return
        refusal = identity_refusal(self.curve, node_id, user_id)
        if refusal is not None:
            if self.refusal_lines.check(("hello", node_id, user_id, address), time.monotonic()) is not None:
                log.info("refused HELLO as %s from %s: its key is named %s", _safe(repr(node_id)),
                         _safe(address or "?"), _safe(repr(user_id)))
            self._refuse_hello(rid, *refusal)
            return
        peer = self.peers.get(rid)
        joined = peer is None
        if peer is None and len(self.peers) >= self.cfg.max_peers:
            self._refuse_hello(rid, "too_many_peers")
            return
        if peer is None:
            peer = Peer(rid, acct=self.queued.open(rid, time.monotonic()), conn=identify(fd))
        if peer.node_id and peer.node_id != node_id.encode():
            self.counts["renamed"] += 1         # ids are claims on an open relay; limits stay per connection
        peer.node_id = node_id.encode()
        peer.key_name = user_id
        peer.address = address
        peer.last_seen = time.monotonic()
        self.peers[rid] = peer
        self.counts["hello"] += 1
        if joined:
            log.info("node %s joined from %s (%d connected)", _safe(node_id), _safe(address or "?"), len(self.peers))
        self._send(rid, [P.WELCOME, orjson.dumps({"epoch": self.epoch.decode(), "heartbeat_s": self.cfg.heartbeat_s,
                                                  "identity": "key" if self.curve else "claimed",
                                                  "relay": self.name})])

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
        old = peer.budgets.get(topic.name)
        useful = _useful_ids(obj.get("useful"))
        useful = useful if useful is not None else (old.useful if old is not None else frozenset())
        self._forget_budget(peer, topic)
        if isinstance(budget, dict) and isinstance(budget.get("k"), int) and budget["k"] > 0:
            w = budget.get("window_s")
            w = float(w) if isinstance(w, (int, float)) and 0.1 <= w <= 3600 else 10.0
            peer.budgets[topic.name] = Budget(min(budget["k"], 10_000), w, useful=useful)
        filters = obj.get("filters")
        peer.filters.pop(topic.name, None)
        if isinstance(filters, dict):
            f = {k: {v for v in vals if isinstance(v, str)} for k, vals in filters.items()
                 if k in ("task", "tok") and isinstance(vals, list) and vals}
            if f:
                peer.filters[topic.name] = f
        topic.subscribers.add(rid)
        peer.cursors[topic.name] = max(last_seq + 1, topic.first_seq)
        now = time.monotonic()
        b = peer.budgets.get(topic.name)
        if b is None:
            topic.full_subs.add(rid)
        else:
            topic.full_subs.discard(rid)
            b.index = topic.index_for(peer.filters.get(topic.name))
            b.index.subs.add(rid)
            b.index.hungry.add(rid)
            b.start_seq = peer.cursors[topic.name]
            b.window_start = now
            self._timer(now + b.window_s, rid, topic.name)
            self._dirty.add((topic.name, Index.key(b.index.filters)))
        self._update_hold(topic, now)
        self._send(rid, [P.SUBOK, topic.name, orjson.dumps({
            "epoch": self.epoch.decode(), "first_seq": topic.first_seq, "next_seq": topic.next_seq,
            "budget": {"k": b.k, "window_s": b.window_s} if b else None})])

    def _on_ping(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        # O(1) per PING, and at most PING_RATE per connection: a PONG carries the peer count,
        # never the peer list (that made 1,000 pinging clients O(N^2) bytes/s)
        if not self.ping_limits.allow(rid, 0, time.monotonic()):
            self.rejected["ping_rate"] += 1
            return
        obj = self._control(args, 1)
        if obj is None:
            return
        a = peer.acct if peer is not None else self.queued.accounts.get(rid)   # (a key's STATS asker)
        if a is not None and isinstance(obj.get("mark"), str):
            self._receipt(a, obj["mark"])
        self._send(rid, [P.PONG, orjson.dumps({"t": obj.get("t"), "epoch": self._epoch_s,
                                               "known": peer is not None, "n_peers": len(self.peers)})])

    def _on_useful(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        """The publishers this subscriber found useful: its budget on the topic favours them
        (relay.budget). It only ever changes the sender's own budget, so it needs no trust."""
        if peer is None:
            self._send(rid, [P.NACK, b"", P.HELLO_FIRST.encode()])
            return
        if not self.control_limits.allow(b"u" + rid, 0, time.monotonic()):
            self.rejected["useful_rate"] += 1
            return
        obj = self._control(args, 2)
        ids = _useful_ids(obj.get("ids")) if obj is not None else None
        b = peer.budgets.get(args[0]) if len(args) == 2 else None
        if ids is None or b is None:
            self.rejected["bad_useful"] += 1
            return
        b.useful = ids
        self.counts["useful"] += 1
        if b.index is not None:
            self._dirty.add((args[0], Index.key(b.index.filters)))

    def _on_stats(self, rid: bytes, peer: Peer | None) -> None:
        """STATS costs O(peers): only for connections that said HELLO (on CURVE every
        connection holds an allowed key), at most STATS_RATE per connection."""
        if peer is None and not self.curve:
            self._refuse_hello(rid, P.HELLO_FIRST)
            return
        now = time.monotonic()
        if not self.control_limits.allow(b"s" + rid, 0, now):
            self.rejected["stats_rate"] += 1
            return
        # its bytes are counted like every reply (a key's connection without HELLO gets an account too)
        if peer is None:
            a = self.queued.open(rid, now)
            self.askers[rid] = now
        else:
            a = peer.acct
        body = self._stats_reply.reply(self.queued.reply_room(a) - reply_bytes([P.STATS, b""]), now)
        if body is None:
            self._over_cap(rid, a, self.queued.reply_room(a) + 1)
            return
        if self._send(rid, [P.STATS, body]):
            self._mark_acct(rid, a, force=True)      # so it can prove it read it before it leaves

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

    def _on_pub(self, rid: bytes, peer: Peer | None, args: list[bytes]) -> None:
        """PUB topic payload [attrs]: each admission check in turn (each NACKs what it
        refuses and returns False), then the rollout is buffered, indexed and ACKed. The order
        matters: cheap refusals first, the prefix read before anything uses its tags, the
        duplicate check before any budget is charged."""
        pub = _Pub(rid, peer, args)
        for check in (self._pub_frames, self._pub_hello_first, self._pub_attrs, self._pub_bridge,
                      self._pub_loop, self._pub_size, self._pub_prefix, self._pub_tags,
                      self._pub_duplicate, self._pub_topic, self._pub_rate, self._pub_accept,
                      self._pub_room):
            if not check(pub):
                return
        self._admit(pub)

    def _pub_refuse(self, pub: "_Pub", reason: str, retry_after_s: float | None = None) -> bool:
        self._nack(pub.rid, pub.peer, pub.rollout_id, reason, retry_after_s)
        return False

    def _pub_frames(self, pub: "_Pub") -> bool:
        return len(pub.args) in (2, 3) or self._pub_refuse(pub, "bad_frame")

    def _pub_hello_first(self, pub: "_Pub") -> bool:
        if pub.peer is None:
            return self._pub_refuse(pub, P.HELLO_FIRST)
        pub.topic_name, pub.payload, pub.sender = pub.args[0], pub.args[1], pub.peer.node_id
        return True

    def _pub_attrs(self, pub: "_Pub") -> bool:
        if len(pub.args) == 3:
            pub.attrs = self._attrs(pub.args[2])
            if pub.attrs is None:
                return self._pub_refuse(pub, "bad_frame")
        return True

    def _pub_bridge(self, pub: "_Pub") -> bool:
        """A federation bridge forwarding another node's rollout: only a trusted bridge, and
        only origins in the namespaces it may speak for."""
        pub.bridged = "origin" in pub.attrs
        if not pub.bridged:
            return True
        bname = pub.peer.node_id.decode(errors="replace")
        if bname not in self.bridges:
            return self._pub_refuse(pub, "untrusted_bridge")
        origin = pub.attrs.pop("origin")
        if not origin_allowed(self.bridges[bname], origin, self.name):
            return self._pub_refuse(pub, "bad_origin")
        pub.sender = origin.encode()
        return True

    def _pub_loop(self, pub: "_Pub") -> bool:
        pub.via = pub.attrs.get("via", [])
        return self._epoch_s not in pub.via or self._pub_refuse(pub, "loop")   # it was here already

    def _pub_size(self, pub: "_Pub") -> bool:
        return len(pub.payload) <= self.cfg.max_message_bytes or self._pub_refuse(pub, "too_large")

    def _pub_prefix(self, pub: "_Pub") -> bool:
        try:
            pub.pk = P.peek_rollout(pub.payload, self.cfg.max_message_bytes)
        except P.PrefixError as e:
            return self._pub_refuse(pub, e.reason)
        pub.rollout_id = pub.pk.rollout_id.encode()
        return True

    def _pub_tags(self, pub: "_Pub") -> bool:
        """The tags subscribers filter on are the rollout's own (its prefix, which is what a
        receiver decodes): a PUB whose attrs claim others is refused."""
        attrs, pk = pub.attrs, pub.pk
        if attrs.get("task", pk.task) != pk.task or attrs.get("tok", pk.tok) != pk.tok:
            return self._pub_refuse(pub, "tag_mismatch")
        attrs["task"], attrs["tok"] = pk.task, pk.tok
        return True

    def _pub_duplicate(self, pub: "_Pub") -> bool:
        """Dedup binds the id to its sender (origin) and its payload: another identity cannot
        squat an id so that the genuine copy, arriving later through a bridge, is dropped. The
        payload is compared with the buffered copy on a repeat only (nothing is hashed here)."""
        pub.seen_key = pub.sender + b"\0" + pub.rollout_id
        known = self.seen.get(pub.seen_key)
        if known is None:
            return True
        t = self.topics.get(known[0])
        first = t.entries.get(known[1]) if t is not None else None
        if first is not None and not (first.size == len(pub.payload) and first.body.endswith(pub.payload)):
            return self._pub_refuse(pub, "id_conflict")          # the same sender's id, another payload
        self.counts["duplicate"] += 1         # a resend after a lost ACK (or a bridge's copy): ACK again
        self._send(pub.rid, [P.ACK, pub.rollout_id, P.pack_seq(known[1]), self.epoch])
        return False

    def _pub_topic(self, pub: "_Pub") -> bool:
        topic = self._use_topic(pub.rid, pub.peer, pub.topic_name)
        if isinstance(topic, str):
            pub.rollout_id = b""
            return self._pub_refuse(pub, topic)
        pub.topic, pub.now = topic, time.monotonic()
        return True

    def _pub_rate(self, pub: "_Pub") -> bool:
        """Per connection and per node id (= key on CURVE); a bridge's rate is its relay's."""
        if pub.bridged:
            return True
        for key in (b"c" + pub.rid, b"n" + pub.peer.node_id):
            if not self.limits.allow(key, len(pub.payload), pub.now):
                return self._pub_refuse(pub, "rate_limited", round(max(0.05, 1.0 / max(self.cfg.rate_msgs, 1e-3)), 3))
        return True

    def _pub_accept(self, pub: "_Pub") -> bool:
        """The global budget, shared per source (the key on CURVE, else the connection): while
        it is spent, only sources above their share (rate / active sources) are refused. A
        source within its share may also use the replay buffer's small reserve."""
        if pub.bridged or self.accept.rate <= 0:
            return True
        peer = pub.peer
        source = b"k" + peer.key_name.encode() if peer.key_name else b"c" + pub.rid
        pub.quiet = self.accept.within_share(source, pub.now)
        return self.accept.admit(source, pub.now) or self._pub_refuse(pub, "busy", self.cfg.busy_retry_s)

    def _pub_room(self, pub: "_Pub") -> bool:
        return pub.topic.room_for(len(pub.payload), reserve=pub.quiet) \
            or self._pub_refuse(pub, "busy", self.cfg.busy_retry_s)

    def _admit(self, pub: "_Pub") -> None:
        topic, attrs = pub.topic, pub.attrs
        pub.via.append(self._epoch_s)
        attrs["via"] = pub.via
        e = topic.append(pub.rollout_id, pub.rid, pub.sender, pub.payload, orjson.dumps(attrs),
                         pub.pk.task, pub.pk.tok, pub.now, source_of(pub.peer.key_name, pub.peer.address, pub.rid))
        if topic.indexes:
            for key in topic.index_new(e):
                self._dirty.add((topic.name, key))
        self.seen[pub.seen_key] = (pub.topic_name, e.seq)
        if len(self.seen) > self.cfg.dedup_size:
            self.seen.popitem(last=False)
        pub.peer.acked += 1
        self.counts["accepted"] += 1
        self._send(pub.rid, [P.ACK, pub.rollout_id, P.pack_seq(e.seq), self.epoch])

    # -------------------------------------------------------------- fan-out
    def _send(self, rid: bytes, frames: list[bytes]) -> bool:
        """A reply (anything but a rollout): counted in the connection's queued bytes like a
        rollout, within its reply room (relay.queued); a connection over it is shed (or, when
        it proved it reads and only the total is full, this reply is skipped). A connection
        that never said HELLO has no account: it is only ever sent small NACKs and PONGs, each
        pipe at most sndhwm of them."""
        a = self.queued.accounts.get(rid)
        if a is None:
            return self._send_raw(rid, frames)
        n = reply_bytes(frames)
        if n > self.queued.reply_room(a):
            self._over_cap(rid, a, n)
            return False
        if not self._send_raw(rid, frames):
            return False
        self.queued.sent(a, n, time.monotonic())
        return True

    def _over_cap(self, rid: bytes, a: Account, n: int) -> None:
        """A reply of n bytes does not fit its room: shed it as a non-reader is, unless it
        proved it reads and is within its own cap (the total is full of others': skip it)."""
        cap = self.queued.peer_cap
        if a.proven and (not cap or a.queued + n <= cap + cap // 4):
            self.counts["reply_skipped"] += 1
            return
        self.counts["shed"] += 1
        self._drop_peer(rid, why=f"over its cap: {a.queued / 2**20:.1f} MB queued and not proven read")

    def _send_raw(self, rid: bytes, frames: list[bytes]) -> bool:
        """Non-blocking send; False when the client's pipe is full or it is gone.

        Frame by frame through relay.frames.send_frame: send_multipart's per-frame enum
        arithmetic was a third of the relay's CPU time in profiles. With ROUTER_MANDATORY a
        full pipe raises EAGAIN on the routing-id frame, before anything is queued."""
        sock = self.sock
        try:
            send_frame(sock, rid, _MORE)
            for f in frames[:-1]:
                send_frame(sock, f, _MORE)
            send_frame(sock, frames[-1], _LAST)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._drop_peer(rid, gone=True, why="its connection is gone")
                return False
            raise

    def _backlog(self) -> bool:
        for t in self.topics.values():
            for rid in t.full_subs:
                peer = self.peers.get(rid)
                if peer is not None and peer.cursors.get(t.name, t.next_seq) < t.next_seq \
                        and peer.blocked_since is None:
                    return True
        return False

    def _update_hold(self, topic: Topic, now: float) -> None:
        """The lowest cursor among everything-subscribers that keep up: the buffer may not
        evict from there on (so ACKs stay honest; see the module docstring).

        A subscriber stops holding when its pipe has been full for slow_after_s while another
        subscriber of the topic *reads* (self.readers: its pipe is not full although it was
        sent more than a pipe holds, or it echoed a MARK): then it is the one that is slow, not the relay (under a
        flood the relay's own I/O can stall every pipe at once, and that must not count; and a
        fresh pipe that was never filled proves nothing, so a crowd of fresh Sybil subscribers
        cannot make a reading one "slow"). A subscriber refused room for its queued bytes
        before it ever echoed a MARK does not hold either: a crowd of non-readers arriving one after another
        kept the buffer full (and publishers busy). A frozen lone subscriber stops pinging
        and is dropped after peer_timeout_s."""
        full = [p for rid in topic.full_subs if (p := self.peers.get(rid)) is not None]
        if not full:
            topic.hold_seq = None
            topic.trim()
            return
        flowing = not self.readers.isdisjoint(topic.subscribers)
        hold = None
        for p in full:
            b = p.blocked_since
            if b is not None and ((now - b >= self.cfg.slow_after_s and flowing) or (p.held and not p.acct.proven)):
                continue              # slow, or refused room before it ever proved it reads (a MARK echoed)
            c = p.cursors.get(topic.name, topic.next_seq)
            hold = c if hold is None else min(hold, c)
        topic.hold_seq = hold
        topic.trim()                  # what the reserve held past a bound, once it was sent

    def _pump_all(self) -> None:
        now = time.monotonic()
        subs = [p for p in self.peers.values() if p.cursors]
        self.queued.subscribers = len(subs) or 1
        self.queued.readers = sum(1 for p in subs if p.acct.proven) or 1
        for topic in self.topics.values():
            for rid in list(topic.full_subs):
                peer = self.peers.get(rid)
                if peer is None:
                    topic.full_subs.discard(rid)
                    topic.subscribers.discard(rid)
                    continue
                self._pump(peer, topic, now)
        self._pump_budgets(now)
        for topic in self.topics.values():
            self._update_hold(topic, now)

    def _blocked(self, peer: Peer, now: float, held: bool = False) -> None:
        if peer.blocked_since is None:
            peer.blocked_since = now
        peer.held = held
        self.readers.discard(peer.rid)

    def _flowed(self, peer: Peer) -> None:
        peer.blocked_since = None
        if peer.out_msgs > self.cfg.sndhwm or peer.acct.proven:   # more than its pipe holds, or a MARK
            self.readers.add(peer.rid)                               # echoed: it reads

    # -------------------------------------------------------------- queued bytes (relay.queued)
    def _room(self, peer: Peer) -> int:
        return self.queued.room(peer.acct)

    def _sent(self, peer: Peer, nmsgs: int, nbytes: int, now: float) -> None:
        peer.out_msgs += nmsgs
        peer.out_bytes += nbytes
        self.queued.sent(peer.acct, nbytes, now)
        self.delivered += nmsgs
        self.delivered_bytes += nbytes

    def _mark(self, peer: Peer, *, force: bool = False, held: bool = False) -> None:
        """`held`: it was refused room; one that never echoed a MARK gets one even with nothing
        queued, so that it can prove it reads (and have the readers' part of the cap)."""
        self._mark_acct(peer.rid, peer.acct, force=force, held=held)

    def _mark_acct(self, rid: bytes, a: Account, *, force: bool = False, held: bool = False) -> None:
        if self.queued.mark_due(a, force) or (held and self.queued.opening_mark_due(a)):
            nonce = os.urandom(8)
            if self._send(rid, [P.MARK, nonce]):
                self.queued.marked(a, nonce)

    def _receipt(self, a: Account, mark: str) -> None:
        """A PING echoed a MARK: what was sent before it is read."""
        try:
            nonce = bytes.fromhex(mark)
        except ValueError:
            return
        if not self.queued.receipt(a, nonce, time.monotonic()):
            self.counts["unknown_mark"] += 1

    def _probe_ghosts(self, limit: int = 1000) -> None:
        """A ghost's bytes stop counting once its connection is gone (a send to it fails with
        EHOSTUNREACH); the empty MARK only probes."""
        ghosts = self.queued.ghosts
        probe = reply_bytes([P.MARK, b""])
        for rid in list(itertools.islice(ghosts, limit)):
            try:
                send_frame(self.sock, rid, _MORE)
                send_frame(self.sock, P.MARK, _MORE)
                send_frame(self.sock, b"", _LAST)
                ghosts[rid].out += probe       # queued for it like any byte (until it is gone)
                self.queued.total += probe
                ghosts.move_to_end(rid)
            except zmq.Again:
                ghosts.move_to_end(rid)
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH:
                    raise
                self.queued.gone(rid)

    def _deliver(self, peer: Peer, e: Entry, now: float) -> bool:
        if e.size > self._room(peer):
            self.counts["queue_full_bytes"] += 1
            self._blocked(peer, now, held=True)
            self._mark(peer, force=True, held=True)
            return False
        if not self._send_raw(peer.rid, [P.DELIVER, e.body]):   # counted by _sent
            self._blocked(peer, now)
            return False
        self._sent(peer, 1, e.size, now)
        self._flowed(peer)
        self._mark(peer)
        return True

    def _pump(self, peer: Peer, topic: Topic, now: float) -> None:
        """Send an everything-subscriber what its cursor has not reached, up to pump_batch.

        The relay's per-delivery path, so it is one tight loop: three frame sends (routing
        id, DELIVER, the prebuilt body) and no per-delivery calls, dict updates or counters
        (they are added once per pump); what _deliver does for one budgeted delivery."""
        name = topic.name
        end = topic.next_seq
        cur = peer.cursors.get(name, end)
        if cur >= end:
            return
        if cur < topic.first_seq:           # fell behind the replay buffer (it was slow, not holding)
            peer.skipped += topic.first_seq - cur
            self.counts["skipped_slow"] += topic.first_seq - cur
            cur = topic.first_seq
        entries, batch, f = topic.entries, self.cfg.pump_batch, peer.filters.get(name)
        node_id, rid, sock, deliver = peer.node_id, peer.rid, self.sock, P.DELIVER
        sent = nbytes = 0
        blocked = gone = held = False
        room = self._room(peer)
        try:
            while cur < end and sent < batch:
                e = entries[cur]
                # never echo back (to the publisher, or a bridge to where it came from)
                if e.sender != node_id and e.sender_rid != rid and (f is None or passes(f, e)):
                    if nbytes + e.size > room:      # its queued bytes are bounded: a full pipe
                        self.counts["queue_full_bytes"] += 1
                        blocked = held = True
                        break
                    send_frame(sock, rid, _MORE)    # EAGAIN here when the pipe is full
                    send_frame(sock, deliver, _MORE)
                    send_frame(sock, e.body, _LAST)
                    sent += 1
                    nbytes += e.size
                cur += 1
        except zmq.Again:
            blocked = True
        except zmq.ZMQError as ex:
            if ex.errno != zmq.EHOSTUNREACH:
                raise
            blocked = gone = True
        peer.cursors[name] = cur
        if sent:
            self._sent(peer, sent, nbytes, now)
        if blocked:
            self._blocked(peer, now, held)
            if gone:
                self._drop_peer(rid, gone=True, why="its connection is gone")
            else:
                self._mark(peer, force=True, held=True)
        elif sent:
            self._flowed(peer)
            self._mark(peer)

    # -------------------------------------------------------------- budgets
    def _timer(self, due: float, rid: bytes, topic: bytes) -> None:
        heapq.heappush(self._timers, (due, next(self._tick), rid, topic))

    def _timer_wait_ms(self) -> int:
        if not self._timers:
            return 200
        return max(1, min(200, int((self._timers[0][0] - time.monotonic()) * 1000) + 1))

    def _budget_of(self, rid: bytes, topic_name: bytes) -> tuple[Peer, Topic, Budget] | None:
        peer, topic = self.peers.get(rid), self.topics.get(topic_name)
        b = peer.budgets.get(topic_name) if peer is not None else None
        return None if b is None or topic is None else (peer, topic, b)

    def _forget_budget(self, peer: Peer, topic: Topic) -> None:
        b = peer.budgets.pop(topic.name, None)
        if b is not None and b.index is not None:
            b.index.subs.discard(peer.rid)
            b.index.hungry.discard(peer.rid)
            if not b.index.subs:
                topic.indexes.pop(Index.key(b.index.filters), None)
        self._budget_retry.discard((peer.rid, topic.name))

    def _pump_budgets(self, now: float) -> None:
        """Visit the budgeted subscribers something happened to: windows that ended, gathering
        that ended, new rollouts in the index of subscribers with budget left, full pipes."""
        timers = self._timers
        if not (self._budget_retry or self._dirty or (timers and timers[0][0] <= now)):
            return                                    # nothing concerns them (every loop turn asks)
        todo: dict[tuple[bytes, bytes], None] = dict.fromkeys(self._budget_retry)
        self._budget_retry = set()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, rid, name = heapq.heappop(timers)
            got = self._budget_of(rid, name)
            if got is None:
                continue
            peer, topic, b = got
            if b.window_over(now):                      # a new window: budget and shares reset
                b.new_window(now, topic.entries)
                b.index.hungry.add(rid)
                self._timer(now + b.window_s, rid, name)
            todo[(rid, name)] = None
        for name, key in self._dirty:
            topic = self.topics.get(name)
            idx = topic.indexes.get(key) if topic is not None else None
            if idx is not None:
                todo.update(dict.fromkeys((rid, name) for rid in idx.hungry))
        self._dirty.clear()
        self.counts["budget_visits"] += len(todo)     # the work that must not grow as N^2
        for rid, name in todo:
            got = self._budget_of(rid, name)
            if got is not None:
                self._pump_budget(*got, now)

    def _pump_budget(self, peer: Peer, topic: Topic, b: Budget, now: float) -> None:
        """Offer at most k rollouts per window: each publisher's two newest not-yet-sent
        rollouts are candidates while younger than one window (the learner takes the newest
        <= 2 per peer); picks go to the most recently active publisher that is below its fair
        share (k / active publishers) this window, its newest unsent rollout first."""
        if b.sent >= b.k:
            b.index.hungry.discard(peer.rid)
            return
        if b.pick_at == 0.0:
            if b.pick(peer.node_id, peer.rid, now, topic.entries, 1 << 30) is None:
                return                                # nothing yet: a new rollout wakes it
            b.pick_at = now + self.cfg.gather_s      # first candidates of this window: gather
            self._timer(b.pick_at, peer.rid, topic.name)
            return
        if now < b.pick_at:
            return
        share, guarded = b.fair_share(peer.node_id, now, topic.entries)
        while b.sent < b.k:
            e = b.pick(peer.node_id, peer.rid, now, topic.entries, share, guarded)
            if e is None:
                return                                # stays hungry: a new rollout wakes it
            if not self._deliver(peer, e, now):
                self._budget_retry.add((peer.rid, topic.name))
                return
            b.record(e)
            self.counts["budget_sent"] += 1
        b.index.hungry.discard(peer.rid)

    def _drop_peer(self, rid: bytes, *, why: str, gone: bool = False) -> None:
        """Forget a peer. Unless its connection is known ``gone``, what is queued for it stays
        counted (as a ghost) until a probe finds the connection closed."""
        peer = self.peers.pop(rid, None)
        self.askers.pop(rid, None)
        if peer is not None and peer.node_id:
            log.info("node %s left: %s (%d connected)", _safe(peer.node_id.decode(errors="replace")), why,
                     len(self.peers))
        if self.queued.drop(rid, gone) and peer is not None and cut(peer.conn):
            self.counts["cut"] += 1        # libzmq frees its pipe; the next probe finds it gone
        self.readers.discard(rid)
        self.limits.forget(b"c" + rid)
        self.ping_limits.forget(rid)
        self.control_limits.forget(b"s" + rid)
        self.control_limits.forget(b"u" + rid)
        for t in self.topics.values():
            if rid in t.subscribers:
                t.subscribers.discard(rid)
                t.full_subs.discard(rid)
                if peer is not None:
                    self._forget_budget(peer, t)
                self._update_hold(t, time.monotonic())

    def _expire_peers(self, now: float) -> None:
        for rid, t in list(self.askers.items()):
            if rid in self.peers:
                del self.askers[rid]             # it said HELLO since: a peer now
            elif now - t > self.cfg.peer_timeout_s:
                self._drop_peer(rid, why="a STATS asker's connection, silent")
        for rid, p in list(self.peers.items()):
            self._mark(p, force=True)        # a slow trickle gets its receipt too
            if now - p.last_seen > self.cfg.peer_timeout_s:
                self._drop_peer(rid, why=f"timed out, silent for {now - p.last_seen:.0f} s")
        for rid in self.queued.stuck(now):
            self._drop_peer(rid, why=f"proved no read for {self.cfg.peer_timeout_s:.0f} s while holding "
                                     f"{self.queued.accounts[rid].queued / 2**20:.1f} MB")

    # -------------------------------------------------------------- stats
    def stats(self) -> dict:
        head, peers = self._stats_parts()
        return {**head, "peers": peers}

    def _peer_stats(self, p: Peer, now: float) -> dict:
        return {
            "node_id": p.node_id.decode(errors="replace"),
            "key": p.key_name,
            "topics": [t.decode(errors="replace") for t in p.cursors],
            "budget": {t.decode(errors="replace"): {"k": b.k, "window_s": b.window_s}
                       for t, b in p.budgets.items()},
            "last_seen_s": round(now - p.last_seen, 2),
            "in_msgs": p.in_msgs, "in_bytes": p.in_bytes,
            "out_msgs": p.out_msgs, "out_bytes": p.out_bytes, "queued_bytes": p.acct.queued,
            "acked": p.acked, "nacked": p.nacked, "skipped": p.skipped,
            "lag": sum(self.topics[t].next_seq - c for t, c in p.cursors.items()
                       if t in self.topics and t not in p.budgets),
            "blocked": p.blocked_since is not None,
            "held_back": p.acct.held_back if p.blocked_since is not None else "",
        }

    def _stats_parts(self) -> tuple[dict, list[dict]]:
        """(everything but the peer list, the peer list): a STATS reply cuts the list to fit."""
        now = time.monotonic()
        return {
            "epoch": self.epoch.decode(),
            "name": self.name,
            "uptime_s": round(time.time() - self.started, 1),
            "bind": self.cfg.bind,
            "curve": self.curve,
            "identity": ("key: a node id is the name of its allow-list certificate" if self.curve else
                         "claimed: open relay, node ids are not verified (use --keys/--allow to bind them to keys)"),
            "queued": {"bytes": self.queued.total, "cap": self.cfg.max_total_queued_bytes,
                       "peer_cap": self.cfg.max_queued_bytes, "ghosts": len(self.queued.ghosts),
                       "ghost_bytes": self.queued.ghost_bytes()},
            "topics": {t.name.decode(errors="replace"): {
                "next_seq": t.next_seq, "buffered": len(t.entries), "buffer_bytes": t.nbytes,
                "subscribers": len(t.subscribers)} for t in self.topics.values()},
            "rejected": dict(self.rejected),
            "refused_handshakes": dict(self.refused_handshakes),
            "counts": {**self.counts, "delivered": self.delivered, "delivered_bytes": self.delivered_bytes},
        }, [self._peer_stats(p, now) for p in self.peers.values()]


def _useful_ids(ids) -> frozenset | None:
    """A USEFUL / SUB list of node ids (the first MAX_USEFUL of them); None when malformed."""
    if not isinstance(ids, list):
        return None
    return frozenset(i.encode() for i in ids[:P.MAX_USEFUL]
                     if isinstance(i, str) and 0 < len(i) <= P.MAX_NODE_ID_LEN)
