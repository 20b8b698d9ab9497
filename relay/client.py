"""A relay client that moves raw rollout messages: acked publishing, deduplicated receiving,
heartbeats, recovery from a relay restart, back-off on `busy` / `rate_limited`, and a health
state that says when the relay is unreachable or refuses us (docs/relay.md).

It depends on `relay.protocol` only, so federation bridges and load tools run it without the
node. The node's `ftis_edge.peers.swarm.SwarmClient` adds the codec on top.

All network I/O happens on one background thread that owns the ZeroMQ socket; callers only
touch thread-safe queues, so a training loop never blocks on the network.

Delivery guarantee across a relay restart: the relay has an epoch (a random id per run).
The client keeps every acknowledged rollout for `keep_acked_s`; when it sees a new epoch it
says HELLO again, re-subscribes from the start of the new relay's buffer and re-publishes
what it kept. Receivers drop duplicates by rollout id, so each accepted rollout is
delivered exactly once while publisher and subscriber stay up.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from operator import itemgetter

import orjson
import zmq
from zmq.utils.monitor import recv_monitor_message

from relay import protocol as P
from relay.text_safety import terminal_safe
from relay.frames import LAST as _LAST, MORE as _MORE, send_frame as _SEND
from relay.keys import ClientKeys
from relay.waker import Waker

USEFUL_MEMORY = 4            # mark_useful() steps a publisher stays named useful without a new mark
log = logging.getLogger(__name__)       # relay.client: a node routes it into node.log (ftis_edge.run.logs)

_first = itemgetter(0)
CONNECTING, CONNECTED, UNREACHABLE, REFUSED = "connecting", "connected", "unreachable", "refused"
_MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_DISCONNECTED)


@dataclass
class Delivery:
    """One raw rollout message that arrived from a peer through the relay."""

    sender: str                 # node id as attested by the relay
    rollout_id: str
    payload: bytes
    seq: int = 0
    topic: str = ""
    received_at: float = field(default_factory=time.time)
    attrs_json: bytes = b""

    @property
    def nbytes(self) -> int:
        return len(self.payload)

    @property
    def attrs(self) -> dict:
        """{task, tok, via: [relay epochs it crossed]} as the publisher and relays tagged it."""
        try:
            a = orjson.loads(self.attrs_json) if self.attrs_json else {}
        except orjson.JSONDecodeError:
            a = {}
        return a if isinstance(a, dict) else {}


class _Outgoing:
    """A published rollout until it is ACKed (a slotted class: one is made per publish)."""

    __slots__ = ("rollout_id", "payload", "attrs", "attempts", "last_sent", "not_before")

    def __init__(self, rollout_id: bytes, payload: bytes, attrs: bytes = b""):
        self.rollout_id, self.payload = rollout_id, payload
        self.attrs = attrs              # PUB's optional 4th frame: JSON {origin, task, tok, via}
        self.attempts = 0
        self.last_sent = 0.0
        self.not_before = 0.0           # busy / rate-limit back-off


class RelayClient:
    """Publish raw rollout messages to a relay topic and receive the other nodes' messages.

    budget_k > 0 asks the relay for at most budget_k rollouts per budget_window_s, chosen
    fairly across publishers among fresh ones; 0 asks for everything. `filters` (e.g.
    {"task": ["gsm8k"]}) limits deliveries to rollouts published with matching attributes.
    """

    def __init__(self, address: str, *, swarm: str, node_id: str, keys: ClientKeys | None = None,
                 ack_timeout_s: float = 2.0, heartbeat_s: float = 1.0, dead_after_s: float = 4.0,
                 keep_acked_s: float = 300.0, keep_acked_max: int = 4096,
                 inbox_max: int = 10_000, dedup_max: int = 200_000,
                 max_message_bytes: int = P.MAX_ROLLOUT_BYTES, subscribe: bool = True,
                 budget_k: int = 0, budget_window_s: float = 10.0, filters: dict | None = None,
                 warn_every_s: float = 30.0):
        if not swarm or len(swarm.encode()) > P.MAX_TOPIC_LEN:
            raise ValueError(f"swarm name must be 1..{P.MAX_TOPIC_LEN} bytes")
        if not node_id or len(node_id.encode()) > P.MAX_NODE_ID_LEN:
            raise ValueError(f"node_id must be 1..{P.MAX_NODE_ID_LEN} bytes")
        if budget_k < 0 or budget_window_s <= 0:
            raise ValueError("budget_k must be >= 0 (0 = everything) and budget_window_s > 0")
        self.address, self.swarm, self.node_id = address, swarm, node_id
        self.keys = keys
        self.ack_timeout_s, self.heartbeat_s, self.dead_after_s = ack_timeout_s, heartbeat_s, dead_after_s
        self.keep_acked_s, self.keep_acked_max = keep_acked_s, keep_acked_max
        self.max_message_bytes = max_message_bytes
        self.subscribe = subscribe                      # False: publish only
        self.budget_k, self.budget_window_s = budget_k, budget_window_s
        self.filters = {k: sorted(v) for k, v in (filters or {}).items() if v}
        self.warn_every_s = warn_every_s
        self._topic = swarm.encode()
        # The one pending count is len(_outbox) + len(_pending): published, not yet ACKed nor
        # refused for good. publish() appends to _outbox under _lock; the I/O thread moves
        # what it drains into _pending under the same lock, so no rollout is ever in neither.
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._inbox: collections.deque = collections.deque(maxlen=inbox_max)
        self._inbox_cv = threading.Condition()
        self._lock = threading.Lock()                  # guards counters, peers and health below
        self._pending_cv = threading.Condition(self._lock)   # wait_pending(): the pending count fell
        self._pending: dict[bytes, _Outgoing] = {}     # I/O thread writes (filled from _outbox under _lock)
        self._next_retry = 0.0                         # earliest time a pending rollout is due
        self._busy_until = 0.0                         # the relay said `busy`: send nothing before
        self._resubscribe = False                      # set_budget() asked for a new SUB
        self._useful: collections.OrderedDict[str, int] = collections.OrderedDict()   # id -> step named; most recent last
        self._useful_step = 0                          # mark_useful() calls so far
        self._useful_sent: tuple = ()                  # the list the relay was last told
        self._send_useful = False                      # mark_useful() changed it: tell the relay
        self._node_b = node_id.encode()
        self._epoch_b = b""                            # the relay's epoch as bytes (DELIVER carries it)
        self._burst = collections.Counter()            # I/O thread: one recv burst's counters ...
        self._burst_items: list = []                   # ... and raw items, published by _flush()
        self._n_bytes_in = self._n_gaps = self._n_duplicates = self._n_replayed = 0   # ... and hot counters
        self._n_sent = self._n_resent = self._n_bytes_out = self._n_acked = 0
        self._topic_names: dict[bytes, str] = {}       # poll(): decoded names, reused
        self._burst_t = 0.0
        self._acked: collections.OrderedDict[bytes, tuple[float, bytes, bytes]] = collections.OrderedDict()
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._dedup_max = dedup_max
        self._stats = collections.Counter()
        self._nacked = collections.Counter()
        self._peers: dict[str, dict] = {}
        self._relay_peers: int | None = None          # connections the relay knows (its PONG)
        self._epoch: str | None = None
        self._relay_name: str | None = None
        self._rx_bytes = 0                             # I/O thread: rollout bytes read since the last WELCOME
        self._mark = ""                                # I/O thread: the newest MARK read (hex), echoed in PING
        self._receipt_due = False                      # a MARK was read: PING soon, the relay waits for it
        self._last_seq = 0
        self._replay_until = 0
        self._connected = False
        self._health = {"state": CONNECTING, "reason": "", "since": time.time()}
        self._last_warned = 0.0
        self._latency_ms: float | None = None
        self._last_heard = 0.0
        self._started_at = 0.0
        self._stop = threading.Event()
        # publish() writes a byte here so the I/O thread wakes at once instead of finishing
        # its poll timeout (a pipe or, on Windows, a socket pair: safe from any thread; zmq
        # sockets are not).
        self._waker = Waker()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None
        self._n_unsent = 0                             # I/O thread: pending, never sent yet

    # -------------------------------------------------------------- public API
    def start(self):
        """Connect and start the background I/O thread (returns self)."""
        if self._thread is None:
            self._ctx = zmq.Context()
            self._started_at = time.monotonic()
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

    def publish_bytes(self, payload: bytes, origin: str | None = None, *,
                      task: str | None = None, tok: str | None = None, via: list | None = None) -> None:
        """Queue an encoded rollout; it is sent and retried in the background until ACKed.

        `task` / `tok`: the tags its prefix holds (the relay filters on the prefix and refuses
        a PUB whose tags differ, `tag_mismatch`). `origin` (federation bridges only)
        names the node that sent it first; the relay accepts it only from trusted bridges."""
        if self._waker.closed:
            raise RuntimeError("client is closed")
        rollout_id = P.peek_rollout(payload, self.max_message_bytes).rollout_id
        attrs = b""
        if origin or task or tok or via:
            attrs = orjson.dumps({k: v for k, v in (("origin", origin), ("task", task), ("tok", tok),
                                                    ("via", via)) if v})
        out = _Outgoing(rollout_id.encode(), payload, attrs)
        with self._lock:
            self._outbox.append(out)
            self._stats["published"] += 1
        self._waker.wake()

    def poll(self, max_items: int | None = None, timeout_s: float = 0.0) -> list:
        """Messages received since the last call (waits up to timeout_s for the first one)."""
        with self._inbox_cv:
            if not self._inbox and timeout_s > 0:
                self._inbox_cv.wait(timeout_s)
            inbox = self._inbox
            n = len(inbox) if max_items is None else min(max_items, len(inbox))
            raw = [inbox.popleft() for _ in range(n)]
        # Items are made here, on the caller's thread and only for what is polled (a node
        # decodes its rollouts here): the I/O thread only dedups and queues.
        make, out, errors = self._make_item, [], 0
        names = self._topic_names
        for sender_b, rid, payload, seq, topic_b, attrs, at in raw:
            sender = names.get(sender_b)
            if sender is None:
                sender = names[sender_b] = sender_b.decode(errors="replace")
                if len(names) > 4096:
                    names.clear()
            topic = names.get(topic_b)
            if topic is None:
                topic = names[topic_b] = topic_b.decode(errors="replace")
            item, error = make(sender, rid, payload, seq, topic, at, attrs)
            errors += error is not None
            out.append(item)
        if errors:
            with self._lock:
                self._stats["decode_errors"] += errors
        return out

    def set_budget(self, budget_k: int, budget_window_s: float | None = None) -> None:
        """Change the delivery budget (0 = everything), e.g. to the measured round time; the
        I/O thread sends the relay a new SUB."""
        if budget_k < 0 or (budget_window_s is not None and budget_window_s <= 0):
            raise ValueError("budget_k must be >= 0 and budget_window_s > 0")
        self.budget_k = budget_k
        if budget_window_s is not None:
            self.budget_window_s = budget_window_s
        self._resubscribe = True
        if not self._waker.closed:
            self._waker.wake()

    def mark_useful(self, node_ids) -> None:
        """Tell the relay which publishers were useful this step (a node: those whose groups it
        trained on with a learning signal). A budgeted subscription favours them over the rest
        (fake identities share a small trial slice, docs/relay.md "Delivery budgets"). The relay
        is told those named in the last USEFUL_MEMORY calls (at most P.MAX_USEFUL, the most
        recently named): a publisher that stops being useful (ids that earned it with cheap
        valid groups, then publish junk) drops out of the list, one with a single unlucky step
        does not."""
        with self._lock:
            self._useful_step += 1
            for n in node_ids:
                if isinstance(n, str) and n and n != self.node_id:
                    self._useful.pop(n, None)
                    self._useful[n] = self._useful_step
            oldest = self._useful_step - USEFUL_MEMORY
            while self._useful and (len(self._useful) > P.MAX_USEFUL or next(iter(self._useful.values())) <= oldest):
                self._useful.popitem(last=False)
            now_named = tuple(self._useful)
            if now_named != self._useful_sent:
                self._useful_sent = now_named
                self._send_useful = True
        if not self._waker.closed:
            self._waker.wake()

    def _useful_list(self) -> list[str]:
        with self._lock:
            return list(reversed(self._useful))

    def _n_pending(self) -> int:
        return len(self._outbox) + len(self._pending)

    def pending(self) -> int:
        """Published and not yet acknowledged (nor refused for good)."""
        with self._lock:
            return self._n_pending()

    def wait_pending(self, at_most: int = 0, timeout_s: float | None = None) -> int:
        """Block until at most `at_most` rollouts are pending (or timeout_s passed); returns
        the pending count. A publisher's flow control without polling: the I/O thread wakes
        waiters once per burst of ACKs (sleep-polling pending() cost a publisher more CPU
        than publishing, profiled in bench_relay.py)."""
        with self._pending_cv:
            self._pending_cv.wait_for(lambda: self._n_pending() <= at_most, timeout_s)
            return self._n_pending()

    def acked_ids(self) -> list[str]:
        """Rollout ids the relay ACKed that are still kept for re-publishing (keep_acked_s,
        keep_acked_max): what a load harness audits against its subscribers."""
        while True:                 # the I/O thread changes it without a lock: copy again
            try:
                return [rid.decode() for rid in list(self._acked)]
            except RuntimeError:
                continue

    def health(self) -> dict:
        """{"state": connecting | connected | unreachable | refused, "reason": one line,
        "since": unix time the state began, "relay": address}."""
        with self._lock:
            return {**self._health, "relay": self.address}

    def stats(self) -> dict:
        """Connection state, relay epoch, heartbeat latency and counters (see docs/relay.md)."""
        with self._lock:
            return {
                "connected": self._connected, "relay_epoch": self._epoch,
                "latency_ms": self._latency_ms, "pending": self._n_pending(),
                "relay_peers": self._relay_peers,
                "health": self._health["state"],
                **{k: self._stats.get(k, 0) for k in (
                    "published", "acked", "sent", "resent", "republished", "received",
                    "duplicates", "replayed", "decode_errors", "gaps", "bytes_out", "bytes_in",
                    "relay_restarts", "inbox_dropped")},
                "nacked": dict(self._nacked),
            }

    def peers(self) -> list[dict]:
        """Nodes seen through their rollouts, with last_seen (unix s) and the number of
        rollouts received from each (how many clients the relay has: stats()["relay_peers"])."""
        with self._lock:
            return [dict(node_id=k, **v) for k, v in sorted(self._peers.items())]

    # -------------------------------------------------------------- what a delivery becomes
    def _make_item(self, sender: str, rid: bytes, payload: bytes, seq: int, topic: str, now: float,
                   attrs: bytes):
        """Turn an accepted delivery into what poll() returns; subclasses decode here (on
        the polling thread). Returns (item, error_or_None)."""
        return Delivery(sender, rid.decode(errors="replace"), payload, seq, topic, now, attrs), None

    @property
    def relay_epoch(self) -> str | None:
        return self._epoch

    @property
    def relay_name(self) -> str | None:
        """The relay's name (its WELCOME): a node of it is NODE@name on other relays."""
        return self._relay_name

    # -------------------------------------------------------------- health
    def _set_health(self, state: str, reason: str = "") -> None:
        with self._lock:
            h = self._health
            if h["state"] == state and h["reason"] == reason:
                return
            self._health = {"state": state, "reason": reason, "since": time.time()}
            self._connected = state == CONNECTED
        if state == CONNECTED:
            log.info("connected to relay %s as %s", self.address, self.node_id)
        elif state in (UNREACHABLE, REFUSED):
            self._last_warned = time.monotonic()
            log.warning("relay %s %s: %s", self.address, state, terminal_safe(reason))   # the relay's words

    def _warn_while_down(self, now: float) -> None:
        h = self._health
        if h["state"] in (UNREACHABLE, REFUSED) and now - self._last_warned >= self.warn_every_s:
            self._last_warned = now
            log.warning("relay %s still %s for %.0f s: %s (training alone meanwhile)",
                        self.address, h["state"], time.time() - h["since"], terminal_safe(h["reason"]))

    def _on_monitor(self, mon: zmq.Socket) -> None:
        while True:
            try:
                ev = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = ev["event"]
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._set_health(REFUSED, f"the relay refused this node's key (ZAP status {ev['value']}); "
                                          "ask the operator to add its NAME.key to the relay's --allow dir")
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL or (
                    kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self._health["state"] != CONNECTED):
                self._set_health(REFUSED, "handshake failed: the relay needs CURVE keys (swarm.client_keys, "
                                          "swarm.server_key)" if self.keys is None else
                                 "CURVE handshake failed: wrong swarm.server_key, or the relay runs without CURVE")
            elif kind == zmq.EVENT_DISCONNECTED and self._health["state"] == CONNECTED:
                self._set_health(UNREACHABLE, "connection lost; reconnecting")

    # -------------------------------------------------------------- I/O thread
    def _socket(self) -> zmq.Socket:
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 10_000)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        s.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + P.FRAME_SLACK)
        if self.keys is not None:
            self.keys.apply(s)
        s.connect(self.address)
        return s

    def _run(self) -> None:
        sock = self._socket()
        mon = sock.get_monitor_socket(_MONITOR_EVENTS)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        poller.register(self._waker.fileno(), zmq.POLLIN)
        try:
            self._hello(sock)
            next_ping = next_hello = 0.0
            last_ping = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if self._receipt_due and now - last_ping >= 1.0 / P.CONTROL_RATE:
                    next_ping = now            # the relay holds our deliveries until it hears the MARK
                if now >= next_ping:
                    next_ping, last_ping, self._receipt_due = now + self.heartbeat_s, now, False
                    # mark: the newest MARK read proves to the relay what we read (it bounds what it queues by it)
                    self._send(sock, [P.PING, orjson.dumps({"t": time.time(), "mark": self._mark})])
                    self._check_silence(now)
                    if not self._connected and (self._health["state"] != REFUSED or now >= next_hello):
                        self._hello(sock)      # harmless if it is merely slow
                        next_hello = now + 10.0   # a refused node asks again every 10 s only
                    self._warn_while_down(now)
                if self._resubscribe and self._connected:
                    self._resubscribe = False
                    self._subscribe(sock)
                if self._send_useful and self._connected and self.budget_k:
                    self._send_useful = False
                    self._send(sock, [P.USEFUL, self._topic, orjson.dumps({"ids": self._useful_list()})])
                if now >= self._next_retry:       # what waits goes before what is new
                    self._retry(sock, now)
                self._drain_outbox(sock, now)
                events = dict(poller.poll(50))
                if self._waker.fileno() in events:
                    self._waker.drain()
                if mon in events:
                    self._on_monitor(mon)
                if sock in events:
                    self._recv_burst(sock)
                self._flush()
        finally:
            try:
                self._send(sock, [P.BYE])
            finally:
                sock.disable_monitor()
                mon.close(0)
                sock.close(0)

    def _check_silence(self, now: float) -> None:
        state = self._health["state"]
        heard = self._last_heard or self._started_at
        if now - heard <= self.dead_after_s:
            return
        if state == CONNECTED:
            self._set_health(UNREACHABLE, f"relay silent for {now - heard:.1f} s")
        elif state == CONNECTING:
            self._set_health(UNREACHABLE, f"no answer from the relay for {now - heard:.0f} s "
                                          "(is it running, and is the address right?)")

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
        req = {"epoch": self._epoch, "last_seq": self._last_seq}
        if self.budget_k:
            req["budget"] = {"k": self.budget_k, "window_s": self.budget_window_s}
        if self.filters:
            req["filters"] = self.filters
        if self._useful:
            req["useful"] = self._useful_list()
        self._send(sock, [P.SUB, self._topic, orjson.dumps(req)])

    def _drain_outbox(self, sock: zmq.Socket, now: float) -> None:
        # Publish order is kept: while an earlier rollout waits unsent (not connected yet,
        # busy, a full pipe), later ones wait behind it for _retry, which sends in order.
        if not self._outbox:            # most loop turns
            return
        pending, fresh, dropped = self._pending, [], 0
        with self._lock:
            while self._outbox:
                out = self._outbox.popleft()
                if out.rollout_id in pending:       # the same rollout published twice
                    dropped += 1
                    continue
                pending[out.rollout_id] = out
                fresh.append(out)
            if dropped:
                self._pending_cv.notify_all()
        self._n_unsent += len(fresh)
        send_now = self._connected and now >= self._busy_until and self._n_unsent == len(fresh)
        for out in fresh:
            # Once one cannot go out, the rest wait for _retry too, which sends in publish order.
            send_now = send_now and self._transmit(sock, out, now)
            if not send_now:
                self._next_retry = min(self._next_retry, max(now, self._busy_until))

    def _transmit(self, sock: zmq.Socket, out: _Outgoing, now: float) -> bool:
        # PUB topic payload [attrs], frame by frame (relay.frames: cheaper than send_multipart).
        # A DEALER takes or refuses a message at its first frame (EAGAIN: not connected, or
        # the pipe is full).
        try:
            _SEND(sock, P.PUB, _MORE)
            _SEND(sock, self._topic, _MORE)
            if out.attrs:
                _SEND(sock, out.payload, _MORE)
                _SEND(sock, out.attrs, _LAST)
            else:
                _SEND(sock, out.payload, _LAST)
        except zmq.Again:
            return False
        if out.attempts == 0:
            self._n_unsent -= 1
            self._n_sent += 1
        else:
            self._n_resent += 1
        out.attempts += 1
        out.last_sent = now
        self._n_bytes_out += len(out.payload)
        return True

    def _retry(self, sock: zmq.Socket, now: float) -> None:
        """(Re)send what is due; remember when the next pending rollout falls due so the
        loop does not scan the whole pending set on every turn."""
        if not self._connected:
            self._next_retry = now + 0.05
            return
        if now < self._busy_until:
            self._next_retry = self._busy_until
            return
        nxt = now + self.ack_timeout_s
        for out in list(self._pending.values()):
            due = max(out.not_before, out.last_sent + self.ack_timeout_s) if out.attempts else out.not_before
            if now >= due:
                if not self._transmit(sock, out, now):
                    nxt = now + 0.01                  # our own pipe is full: try again soon
                    break
                due = now + self.ack_timeout_s
            nxt = min(nxt, due)
        self._next_retry = nxt

    def _recv_burst(self, sock: zmq.Socket, max_msgs: int = 1000) -> None:
        """Drain up to max_msgs waiting messages in arrival order. DELIVERs (nearly all of
        them) take a short path: no per-message clock reads or dispatch (profiled: the
        per-delivery overhead around the work was half the client's receive cost)."""
        self._burst_t = time.time()
        mono = time.monotonic()
        recv, deliver, on_deliver, ack = sock.recv, P.DELIVER, self._on_deliver_body, P.ACK
        pending, acked, n_acked = self._pending, self._acked, 0
        n = 0
        for n in range(1, max_msgs + 1):
            try:
                # frame by frame: recv_multipart asks getsockopt(RCVMORE) per frame, which
                # builds an enum each time (1 us of ~7 per delivery); Frame.more does not
                f = recv(zmq.NOBLOCK, copy=False)
                frames = [f.bytes]
                while f.more:
                    f = recv(zmq.NOBLOCK, copy=False)
                    frames.append(f.bytes)
            except zmq.Again:
                n -= 1
                break
            try:
                kind = frames[0]
                if kind == deliver and len(frames) == 2:
                    on_deliver(frames[1])
                elif kind == ack and len(frames) == 4:
                    # ACK rollout_id seq epoch: the publisher's short path (one per rollout)
                    out = pending.pop(frames[1], None)
                    if out is not None:
                        self._n_unsent -= out.attempts == 0   # (a stray ACK of a re-published one)
                        acked[frames[1]] = (mono, out.payload, out.attrs)
                        n_acked += 1                # _flush wakes wait_pending()
                else:
                    self._on_message(sock, frames)
            except Exception:       # a bad frame must not kill the client
                log.exception("bad message from relay")
        if n_acked:
            self._n_acked += n_acked
            self._trim_acked(mono)
        if n:
            self._last_heard = mono

    def _on_message(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        now = time.monotonic()
        self._last_heard = now
        kind = frames[0]
        if kind == P.DELIVER and len(frames) == 2:
            self._on_deliver_body(frames[1])
        elif kind == P.NACK and len(frames) in (3, 4):
            detail = {}
            if len(frames) == 4:
                try:
                    detail = orjson.loads(frames[3])
                except orjson.JSONDecodeError:
                    pass
            self._on_nack(sock, frames[1], frames[2].decode(errors="replace"),
                          detail if isinstance(detail, dict) else {}, now)
        elif kind == P.PONG and len(frames) == 2:
            obj = orjson.loads(frames[1])
            if isinstance(obj.get("t"), (int, float)):
                with self._lock:
                    self._latency_ms = round((time.time() - obj["t"]) * 1000, 3)
            if self._check_epoch(sock, obj.get("epoch")) or not obj.get("known"):
                if self._health["state"] != REFUSED:
                    self._hello(sock)          # a relay that does not know us yet
            n = obj.get("n_peers")
            if isinstance(n, int):
                with self._lock:
                    self._relay_peers = n
        elif kind == P.MARK and len(frames) == 2:
            if frames[1]:                      # (an empty one only probes that we are still here)
                self._mark, self._receipt_due = frames[1].hex(), True
        elif kind == P.WELCOME and len(frames) == 2:
            self._rx_bytes = 0             # what came before it was counted by the relay's base
            obj = orjson.loads(frames[1])
            if isinstance(obj.get("relay"), str):
                self._relay_name = obj["relay"]
            self._check_epoch(sock, obj.get("epoch"))
            self._set_health(CONNECTED)
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
        self._epoch_b = epoch.encode()
        self._last_seq = 0
        if restarted:
            # A new relay instance: it knows nothing of us. Register again and re-publish
            # what the old one acknowledged (receivers drop the copies they already have).
            log.warning("relay restarted (epoch %s): re-publishing %d acked rollouts", terminal_safe(str(epoch)),
                        len(self._acked))
            with self._lock:
                self._stats["relay_restarts"] += 1
                self._connected = False
            now = time.monotonic()
            self._trim_acked(now)
            for rid, (_, payload, attrs) in self._acked.items():
                if rid not in self._pending:
                    self._pending[rid] = _Outgoing(rid, payload, attrs)
                    self._n_unsent += 1
                    with self._lock:
                        self._stats["republished"] += 1
            self._acked.clear()
            self._next_retry = now
        return True

    def _trim_acked(self, now: float) -> None:
        while self._acked and (len(self._acked) > self.keep_acked_max or
                               now - next(iter(self._acked.values()))[0] > self.keep_acked_s):
            self._acked.popitem(last=False)

    def _on_nack(self, sock: zmq.Socket, rid: bytes, reason: str, detail: dict, now: float) -> None:
        if reason == P.HELLO_FIRST:
            # The relay does not know us (it restarted, or forgot us): register again; the
            # rollout stays pending and is re-sent after the WELCOME.
            with self._lock:
                self._connected = False
            self._hello(sock)
            return
        with self._lock:
            self._nacked[reason] += 1
        if not rid and reason in P.REFUSED_AT_HELLO:
            self._set_health(REFUSED, f"the relay refused HELLO as {self.node_id!r}: {reason}"
                                      + (f" ({detail['detail']})" if detail.get("detail") else ""))
            return
        out = self._pending.get(rid)
        if out is None:
            return
        if reason in P.RETRY_LATER:
            wait = detail.get("retry_after_s")
            if not isinstance(wait, (int, float)) or not 0 < wait <= 60:
                wait = min(0.2 * 2 ** min(out.attempts, 5), 5.0)
            # jitter so that publishers told to wait together do not come back together
            out.not_before = now + wait * random.uniform(1.0, 1.5)
            out.last_sent = 0.0
            out.attempts = max(out.attempts, 1)
            if reason == "busy":          # the whole relay is behind, not just this rollout
                # one jittered time for the whole busy spell: the rollouts told to wait come
                # back in publish order (per-rollout jitter reordered them)
                self._busy_until = max(self._busy_until, out.not_before)
                out.not_before = self._busy_until
            self._next_retry = min(self._next_retry, out.not_before)
            return
        with self._lock:
            del self._pending[rid]        # refused for good: counted, not retried
            self._pending_cv.notify_all()

    def _on_deliver_body(self, body: bytes) -> None:
        """Dedup one delivery and queue it raw: counters are plain ints, and the inbox item
        (and a node's decode) is made by poll() on the caller's thread, only for what is
        polled (_flush publishes a burst at once: per-delivery locking and wake-ups, then
        per-delivery objects, dominated the client's cost in profiles)."""
        try:
            seq, topic, epoch, sender_b, rid, attrs, payload = P.unpack_deliver(body)
        except ValueError:
            return
        self._n_bytes_in += len(payload)
        self._rx_bytes += len(payload)
        if epoch == self._epoch_b:
            last = self._last_seq
            if seq > last:
                if last and seq > last + 1 and not self.budget_k:
                    self._n_gaps += seq - last - 1
                self._last_seq = seq
        seen, key = self._seen, sender_b + b"\0" + rid    # by sender too: an id squatted by another
        if key in seen or sender_b == self._node_b:    # sender must not hide the genuine copy
            self._n_duplicates += sender_b != self._node_b
            return
        seen[key] = None
        if len(seen) > self._dedup_max:
            seen.popitem(last=False)
        self._n_replayed += seq <= self._replay_until
        self._burst_items.append((sender_b, rid, payload, seq, topic, attrs, self._burst_t))

    def _flush(self) -> None:
        """Publish what a burst of messages produced: counters, peers, inbox (one lock each)."""
        items = self._burst_items
        if not (self._burst or items or self._n_bytes_in or self._n_bytes_out or self._n_acked):
            return
        now = self._burst_t
        b = self._burst
        if self._n_bytes_out or self._n_acked:
            b["sent"] += self._n_sent
            b["resent"] += self._n_resent
            b["bytes_out"] += self._n_bytes_out
            b["acked"] += self._n_acked
            self._n_sent = self._n_resent = self._n_bytes_out = self._n_acked = 0
        if self._n_bytes_in:
            b["bytes_in"] += self._n_bytes_in
            b["gaps"] += self._n_gaps
            b["duplicates"] += self._n_duplicates
            b["replayed"] += self._n_replayed
            b["received"] += len(items)
            self._n_bytes_in = self._n_gaps = self._n_duplicates = self._n_replayed = 0
        senders = collections.Counter(map(_first, items)) if items else {}
        with self._lock:
            if b["acked"]:                  # (their ACKs took them out of _pending)
                self._pending_cv.notify_all()
            self._stats.update(b)
            peers = self._peers
            for sender_b, n in senders.items():
                sender = sender_b.decode(errors="replace")
                p = peers.get(sender)
                if p is None:
                    p = peers[sender] = {"last_seen": now, "rollouts": 0}
                p["last_seen"] = now
                p["rollouts"] += n
        b.clear()
        if items:
            with self._inbox_cv:
                was_empty = not self._inbox
                room = self._inbox.maxlen - len(self._inbox)
                dropped = max(0, len(items) - room)   # the node is not polling: oldest go
                self._inbox.extend(items)
                if was_empty:   # poll() waits only on an empty inbox: else nobody to wake
                    self._inbox_cv.notify_all()
            if dropped:
                with self._lock:
                    self._stats["inbox_dropped"] += dropped
            self._burst_items = []


