"""What the relay and its clients share, and nothing else (docs/relay.md, "Protocol").

Like the ZeroMQ guide's Majordomo, the broker (`relay.server`) and the clients (`relay.client`,
and the node's `ftis_edge.peers.swarm` on top of it) depend on this module only: the relay runs with
pyzmq + orjson and never imports the node, its codec or torch. The one thing the relay reads
from a rollout, its uncompressed prefix, is defined here; `ftis_edge.rollout.wire` writes it and
imports the layout from here.

Every message is a ZeroMQ multipart message; the first frame names its type. Clients use a
DEALER socket, the relay a ROUTER socket (which prepends the client's routing id).

client -> relay                         relay -> client
  HELLO   {node_id, protocol}             WELCOME {epoch, heartbeat_s, identity, relay}
  SUB     topic {epoch, last_seq,         SUBOK   topic {epoch, first_seq, next_seq, budget}
               [budget: {k, window_s},    DELIVER meta+payload      (see pack_deliver)
                filters: {task, tok}]}
  PUB     topic payload [attrs]           ACK     rollout_id seq(u64) epoch
  PING    {t, mark}                       NACK    rollout_id reason [{retry_after_s, detail}]
  STATS (after HELLO)                     PONG    {t, epoch, known, n_peers}
  USEFUL  topic {ids: [node ids]}         STATS   {...}
  BYE [{mark}]                            MARK    nonce   (echo the newest read in PING or BYE "mark")
(USEFUL: the publishers a budgeted subscriber found useful, which its budget favours; SUB may
carry the same list as "useful", so a re-subscription keeps it.)
"""
from __future__ import annotations

import struct
from typing import NamedTuple

HELLO, WELCOME, SUB, PUB, ACK, NACK = b"HELLO", b"WELCOME", b"SUB", b"PUB", b"ACK", b"NACK"
DELIVER, PING, PONG, STATS, BYE = b"DELIVER", b"PING", b"PONG", b"STATS", b"BYE"
SUBOK, USEFUL, MARK = b"SUBOK", b"USEFUL", b"MARK"

RELAY_PROTOCOL = 5            # 2: PUB attrs frame, NACK details, SUB budgets, identity binding;
                              # 3: PONG has n_peers, no peer list; STATS after HELLO; PING/STATS rate-limited;
                              # 4: USEFUL (and SUB "useful"); rollout tags read from the prefix;
                              #    WELCOME names the relay; bridged origins are NODE@RELAY; PING rx
                              #    (rollout bytes read since WELCOME: the relay bounds queued bytes by it)
                              # 5: MARK nonce (relay -> client, in its pipe after deliveries) and
                              #    PING {mark}: the newest MARK read proves what was read; rx is ignored
NAMESPACE = "@"               # a bridged node's id on other relays: NODE@RELAY (its home relay's name);
                              # local node ids may not contain it, so no local id is ever a bridged one
MAX_USEFUL = 64               # publishers one USEFUL / SUB may name (the most recently useful)
CONTROL_RATE, CONTROL_BURST = 2.0, 4.0   # STATS, USEFUL per second per connection the relay answers,
                                         # and the most PINGs per second a client sends
PING_RATE, PING_BURST = 2 * CONTROL_RATE, 2 * CONTROL_BURST   # PINGs the relay answers: twice what a
                              # client sends, so that PINGs bunched on the way never trip it
SEQ = struct.Struct("<Q")
MAX_TOPIC_LEN = 128
MAX_NODE_ID_LEN = 128
MAX_CONTROL_BYTES = 4096      # JSON control frames (HELLO, SUB, PING, PUB attrs)
MAX_ROLLOUT_BYTES = 4 << 20   # one encoded rollout: the codec refuses to write more, the relay to take more
MAX_BODY_BYTES = 16 << 20     # a rollout's body once decompressed (decompression-bomb cap)
FRAME_SLACK = 64 << 10        # socket MAXMSGSIZE = MAX_ROLLOUT_BYTES + this (other frames, headroom)

# NACK reasons. Retryable ones keep the rollout pending at the client (with the relay's
# retry_after_s); `hello_first` makes it register again; every other reason is final.
RETRY_LATER = frozenset({"rate_limited", "busy"})
HELLO_FIRST = "hello_first"
IDENTITY = "identity"         # HELLO's node_id is not the name of the CURVE key it connected with
REFUSED_AT_HELLO = frozenset({IDENTITY, "too_many_peers", "bad_version", "bad_hello"})


# ---------------------------------------------------------------- the rollout prefix
# Written by ftis_edge.rollout.wire.encode, read by the relay without decompressing anything:
#   b"FTR" | u8 protocol | u8 codec | task | tokenizer | rollout id | u32 body length
# where task, tokenizer and id are each (u8 kind, u8 length, bytes): kind 1 = lowercase hex
# packed two chars per byte, kind 0 = the string's bytes (printable ASCII for the id, printable
# UTF-8 for the tags). The task tag and tokenizer fingerprint live here and nowhere else in the
# rollout: the relay filters on exactly what a receiver decodes, so a publisher cannot tag a
# rollout as another task than it is.
ROLLOUT_MAGIC = b"FTR"
ROLLOUT_VERSION = 3          # 3: task and tokenizer in the prefix (not the body header);
                             # 2: token byte lengths in the body (wire.py); older ones are refused
ROLLOUT_CODECS = {"none": 0, "zlib": 1, "lzma": 2}
_CODEC_NAMES = {v: k for k, v in ROLLOUT_CODECS.items()}
PREFIX_FIXED = struct.Struct("<3sBB")     # magic, protocol, codec
MAX_TAG_BYTES = 128          # a task tag or tokenizer fingerprint (the PUB attrs' limit too)
_U32 = struct.Struct("<I")
_HEX = frozenset("0123456789abcdef")


class PrefixError(ValueError):
    """A message whose rollout prefix is unusable; `.reason` is the NACK / WireError reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RolloutPrefix(NamedTuple):
    """What the relay reads from a rollout message (a named tuple: it is made for every
    message a client publishes or the relay accepts, and a frozen dataclass's init was a
    third of peek_rollout's cost)."""

    protocol: int
    codec: str
    rollout_id: str
    body_len: int
    payload_offset: int
    task: str
    tok: str


def pack_str(value: str, limit: int = 255) -> bytes:
    """(u8 kind, u8 length, bytes): even-length lowercase hex packs to bytes (kind 1)."""
    if value and len(value) % 2 == 0 and set(value) <= _HEX:
        raw, kind = bytes.fromhex(value), 1
    else:
        raw, kind = value.encode("utf-8"), 0
    if len(raw) > limit:
        raise PrefixError("bad_header", f"string field of {len(raw)} bytes (limit {limit})")
    return bytes((kind, len(raw))) + raw


def pack_prefix(codec: str, rollout_id: str, task: str, tok: str, body_len: int) -> bytes:
    """The prefix of a rollout whose body (once decompressed) is body_len bytes."""
    return (PREFIX_FIXED.pack(ROLLOUT_MAGIC, ROLLOUT_VERSION, ROLLOUT_CODECS[codec])
            + pack_str(task, MAX_TAG_BYTES) + pack_str(tok, MAX_TAG_BYTES) + pack_str(rollout_id)
            + _U32.pack(body_len))


def _field(data, off: int, n: int, what: str, ascii_only: bool) -> tuple[str, int]:
    """One (kind, length, bytes) string of the prefix at off: (string, offset after it)."""
    if n < off + 2:
        raise PrefixError("truncated", "message ends inside the prefix")
    kind, ln = data[off], data[off + 1]
    raw = bytes(data[off + 2:off + 2 + ln])
    if len(raw) < ln:
        raise PrefixError("truncated", "message ends inside the prefix")
    if kind == 1:
        return raw.hex(), off + 2 + ln
    if kind == 0:
        try:
            s = raw.decode("ascii" if ascii_only else "utf-8")
        except UnicodeDecodeError:
            s = None
        if s is not None and s.isprintable():
            return s, off + 2 + ln
    raise PrefixError("bad_header", f"{what} must be printable {'ASCII' if ascii_only else 'UTF-8'}")


def peek_rollout(data: bytes, max_message_bytes: int = MAX_ROLLOUT_BYTES,
                 max_body_bytes: int = MAX_BODY_BYTES) -> RolloutPrefix:
    """Parse and check the uncompressed prefix; PrefixError when it is unusable."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PrefixError("bad_header", f"expected bytes, got {type(data).__name__}")
    n = len(data)
    if n > max_message_bytes:
        raise PrefixError("too_large", f"{n} bytes > limit {max_message_bytes}")
    if n < PREFIX_FIXED.size:
        raise PrefixError("truncated", f"{n} bytes is shorter than the prefix")
    magic, version, codec = PREFIX_FIXED.unpack_from(data, 0)
    if magic != ROLLOUT_MAGIC:
        raise PrefixError("bad_header", "not an ftis rollout (bad magic)")
    if version != ROLLOUT_VERSION:
        raise PrefixError("bad_version", f"protocol {version}, this node speaks {ROLLOUT_VERSION}")
    if codec not in _CODEC_NAMES:
        raise PrefixError("bad_header", f"unknown codec {codec}")
    task, off = _field(data, PREFIX_FIXED.size, n, "task", False)
    tok, off = _field(data, off, n, "tokenizer", False)
    if len(task.encode()) > MAX_TAG_BYTES or len(tok.encode()) > MAX_TAG_BYTES:
        raise PrefixError("bad_header", f"task and tokenizer tags are at most {MAX_TAG_BYTES} bytes")
    rid, off = _field(data, off, n, "rollout_id", True)
    if not 0 < len(rid) <= 64:
        raise PrefixError("bad_header", f"rollout_id must be 1..64 chars, got {len(rid)}")
    if n < off + 4:
        raise PrefixError("truncated", "message ends inside the prefix")
    (body_len,) = _U32.unpack_from(data, off)
    if body_len > max_body_bytes:
        raise PrefixError("too_large", f"body of {body_len} bytes > limit {max_body_bytes}")
    return RolloutPrefix(version, _CODEC_NAMES[codec], rid, body_len, off + 4, task, tok)


# ---------------------------------------------------------------- DELIVER
MAX_ATTRS_BYTES = 1024        # PUB's attrs frame (JSON {origin, task, tok, via}); DELIVER carries it on
MAX_VIA = 16                  # relays a rollout may cross (federation hop limit)


def pack_deliver(seq: int, topic: bytes, epoch: bytes, sender: bytes, rollout_id: bytes,
                 attrs: bytes, payload: bytes) -> bytes:
    """The DELIVER body, built once per rollout at the relay (one frame fewer per delivery:
    sends are the relay's main cost): u64 seq, four (u8 length, bytes) strings (topic, epoch,
    sender, rollout id), (u16 length, bytes) attrs JSON, then the rollout."""
    return b"".join((SEQ.pack(seq), bytes((len(topic),)), topic, bytes((len(epoch),)), epoch,
                     bytes((len(sender),)), sender, bytes((len(rollout_id),)), rollout_id,
                     len(attrs).to_bytes(2, "little"), attrs, payload))


def unpack_deliver(body: bytes) -> tuple[int, bytes, bytes, bytes, bytes, bytes, bytes]:
    """(seq, topic, epoch, sender, rollout_id, attrs, payload); ValueError when malformed.
    Unrolled: it runs once per delivery in every client (a third of the client's cost)."""
    try:
        seq = SEQ.unpack_from(body)[0]
        o = 8
        n = body[o]; topic = body[o + 1:o + 1 + n]; o += 1 + n
        n = body[o]; epoch = body[o + 1:o + 1 + n]; o += 1 + n
        n = body[o]; sender = body[o + 1:o + 1 + n]; o += 1 + n
        n = body[o]; rid = body[o + 1:o + 1 + n]; o += 1 + n
        n = body[o] | body[o + 1] << 8
        attrs = body[o + 2:o + 2 + n]
        o += 2 + n
    except (IndexError, struct.error):
        raise ValueError("DELIVER meta truncated") from None
    if o > len(body):           # a short field shows here, or as an IndexError above
        raise ValueError("DELIVER truncated")
    return seq, topic, epoch, sender, rid, attrs, body[o:]


def home_id(sender: str) -> str:
    """The node id a rollout names itself by: a bridged sender NODE@RELAY is NODE."""
    return sender.partition(NAMESPACE)[0]


def pack_seq(seq: int) -> bytes:
    return SEQ.pack(seq)


def check_bind(address: str) -> str | None:
    """A one-line hint when `address` is not a ZeroMQ endpoint (None when it looks fine)."""
    if "://" not in address:
        return f"{address!r} is not a ZeroMQ endpoint; did you mean tcp://{address} ?"
    return None
