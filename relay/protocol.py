"""Frames spoken between `ftis-relay` and its clients (see docs/relay.md).

Every message is a ZeroMQ multipart message; the first frame names its type. Clients use a
DEALER socket, the relay a ROUTER socket (which prepends the client's routing id).

client -> relay                         relay -> client
  HELLO   {node_id, protocol}             WELCOME {epoch, heartbeat_s}
  SUB     topic {epoch, last_seq}         SUBOK   topic {epoch, first_seq, next_seq}
                                          DELIVER meta+payload      (see pack_deliver)
  PUB     topic payload                   ACK     rollout_id seq(u64) epoch
  PING    {t}                             NACK    rollout_id reason
  STATS                                   PONG    {t, epoch, peers}
  BYE                                     STATS   {...}
"""
from __future__ import annotations

import struct

HELLO, WELCOME, SUB, PUB, ACK, NACK = b"HELLO", b"WELCOME", b"SUB", b"PUB", b"ACK", b"NACK"
DELIVER, PING, PONG, STATS, BYE = b"DELIVER", b"PING", b"PONG", b"STATS", b"BYE"
SUBOK = b"SUBOK"

RELAY_PROTOCOL = 1
SEQ = struct.Struct("<Q")
MAX_TOPIC_LEN = 128
MAX_NODE_ID_LEN = 128
MAX_CONTROL_BYTES = 4096     # JSON control frames (HELLO, SUB, PING)


def pack_meta(seq: int, topic: bytes, epoch: bytes, sender: bytes, rollout_id: bytes) -> bytes:
    """DELIVER's metadata: u64 seq, then four (u8 length, bytes) strings."""
    parts = [SEQ.pack(seq)]
    for b in (topic, epoch, sender, rollout_id):
        parts += [bytes((len(b),)), b]
    return b"".join(parts)


def pack_deliver(seq: int, topic: bytes, epoch: bytes, sender: bytes, rollout_id: bytes,
                 payload: bytes) -> bytes:
    """The DELIVER body: metadata then the rollout, built once per rollout at the relay
    (one frame fewer per delivery: sends are the relay's main cost)."""
    return pack_meta(seq, topic, epoch, sender, rollout_id) + payload


def unpack_deliver(body: bytes) -> tuple[int, bytes, bytes, bytes, bytes, bytes]:
    """(seq, topic, epoch, sender, rollout_id, payload); ValueError when malformed."""
    seq, topic, epoch, sender, rid, off = _unpack_meta(body)
    return seq, topic, epoch, sender, rid, body[off:]


def _unpack_meta(meta: bytes) -> tuple[int, bytes, bytes, bytes, bytes, int]:
    """Parse pack_meta's layout at the start of `meta`; returns the fields and the end offset."""
    if len(meta) < SEQ.size:
        raise ValueError("DELIVER meta too short")
    seq = SEQ.unpack_from(meta)[0]
    off, out = SEQ.size, []
    for _ in range(4):
        if off >= len(meta):
            raise ValueError("DELIVER meta truncated")
        n = meta[off]
        if off + 1 + n > len(meta):
            raise ValueError("DELIVER meta truncated")
        out.append(meta[off + 1:off + 1 + n])
        off += 1 + n
    return (seq, *out, off)


def pack_seq(seq: int) -> bytes:
    return SEQ.pack(seq)


def unpack_seq(b: bytes) -> int:
    return SEQ.unpack(b)[0]
