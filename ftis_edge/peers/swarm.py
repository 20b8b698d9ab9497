"""The node's only door to the swarm: `relay.client.RelayClient` (acked publishing,
deduplicated receiving, heartbeats, recovery from a relay restart, health) plus the rollout
codec. See docs/relay.md.

The relay side shares `relay.protocol` with this module and nothing else; this module adds
what only a node needs: encoding rollouts on publish, decoding and checking them on receive.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ftis_edge.rollout import wire
from ftis_edge.rollout.wire import Rollout, WireError
from relay import protocol as P
from relay.client import CONNECTED, CONNECTING, REFUSED, UNREACHABLE, RelayClient
from relay.keys import ClientKeys

__all__ = ["SwarmClient", "Received", "ClientKeys", "CONNECTED", "CONNECTING", "UNREACHABLE", "REFUSED"]


@dataclass(slots=True)
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


class SwarmClient(RelayClient):
    """Publish rollouts to a relay topic and receive the other nodes' rollouts.

    Everything RelayClient takes (budget_k, budget_window_s, filters, warn_every_s, ...),
    plus the codec, the receiver's limits, and decode=False to keep raw payloads."""

    def __init__(self, address: str, *, swarm: str, node_id: str, keys: ClientKeys | None = None,
                 limits: wire.WireLimits = wire.DEFAULT_LIMITS, codec: str = wire.DEFAULT_CODEC,
                 decode: bool = True, **kw):
        super().__init__(address, swarm=swarm, node_id=node_id, keys=keys,
                         max_message_bytes=limits.max_message_bytes, **kw)
        self.limits, self.codec, self.decode = limits, codec, decode

    def publish(self, rollout: Rollout) -> None:
        """Queue a rollout; it is sent and retried in the background until acknowledged.

        Encoding happens here, so a malformed rollout raises WireError in the caller. The
        rollout is tagged with its task and tokenizer for subscribers' filters."""
        self.publish_bytes(wire.encode(rollout, codec=self.codec, limits=self.limits),
                           task=rollout.task, tok=rollout.tokenizer_fp)

    def publish_bytes(self, payload: bytes, origin: str | None = None, **tags) -> None:
        """Queue an already encoded rollout (forwarding, benchmarks); WireError on a bad prefix."""
        try:
            super().publish_bytes(payload, origin, **tags)
        except P.PrefixError as e:
            raise WireError(e.reason, e.message) from None

    def _make_item(self, sender: str, rid: bytes, payload: bytes, seq: int, topic: str, now: float,
                   attrs: bytes):
        """Decode (and check against what the relay attested) on the polling thread."""
        error = rollout = None
        if self.decode:
            try:
                rollout = wire.decode(payload, self.limits)
                if rollout.node_id != P.home_id(sender):     # NODE@RELAY across a bridge
                    raise WireError("sender_mismatch", f"rollout claims node {rollout.node_id!r}, "
                                                       f"relay says it came from {sender!r}")
                if rollout.rollout_id.encode() != rid:
                    raise WireError("bad_header", "rollout id differs from the relay's")
            except WireError as e:
                error, rollout = e, None
        return Received(rollout, sender, len(payload), error, seq, topic, now, rid.decode(errors="replace"),
                        None if self.decode else payload), error
