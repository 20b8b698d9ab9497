"""Federation: a bridge joins one swarm across two relays.

It is two ordinary relay clients (`relay.client.RelayClient`: publish + subscribe, no
decoding) that forward each other's deliveries with `publish_bytes(payload, origin=sender)`.
Each relay must trust the bridge (`--trust-bridge NAME`; on a CURVE relay NAME is the
bridge's key name; an open relay also needs `--open-bridges`, since there NAME is a claim),
so it keeps the original sender on forwarded rollouts, namespaced by its home relay: alice of
relay A is `alice@A` on every other relay (`--trust-bridge NAME=A,C` limits the namespaces a
bridge may assert), so no bridge can pose as a local node. Loops are cut
three ways: a relay never sends a rollout back on the connection it came from, a bridge never
forwards a rollout to a relay that already has it (relays ACK a known rollout id without
delivering it again), and nodes drop rollout ids they have already seen. Acks, retries,
`busy` back-off and relay restarts are handled by the clients exactly as for a node.

    ftis-relay bridge --swarm S --node-id bridge-1 tcp://relay-a:5555 tcp://relay-b:5555
"""
from __future__ import annotations

import logging
import threading

from relay import protocol as P
from relay.client import RelayClient
from relay.keys import ClientKeys

log = logging.getLogger("ftis-relay.bridge")


class Bridge:
    """Forward a swarm's rollouts both ways between relay A and relay B."""

    def __init__(self, a: str, b: str, *, swarm: str, node_id: str,
                 keys_a: ClientKeys | None = None, keys_b: ClientKeys | None = None):
        self.a = RelayClient(a, swarm=swarm, node_id=node_id, keys=keys_a)
        self.b = RelayClient(b, swarm=swarm, node_id=node_id, keys=keys_b)
        self.forwarded = {"a_to_b": 0, "b_to_a": 0, "not_sent_back": 0}
        self._stop = threading.Event()

    def start(self) -> "Bridge":
        self.a.start()
        self.b.start()
        return self

    def forward_once(self, timeout_s: float = 0.05) -> int:
        """Forward what arrived since the last call; returns how many rollouts moved."""
        moved = 0
        for src, dst, key in ((self.a, self.b, "a_to_b"), (self.b, self.a, "b_to_a")):
            for item in src.poll(timeout_s=timeout_s if moved == 0 else 0.0):
                via = item.attrs.get("via") or []
                if dst.relay_epoch in via:        # that relay had it already (it came from there)
                    self.forwarded["not_sent_back"] += 1
                    continue
                # a node of src is NODE@src on dst (a bridged one keeps its home namespace)
                origin = item.sender if P.NAMESPACE in item.sender else f"{item.sender}{P.NAMESPACE}{src.relay_name}"
                dst.publish_bytes(item.payload, origin=origin, task=item.attrs.get("task"),
                                  tok=item.attrs.get("tok"), via=via)
                self.forwarded[key] += 1
                moved += 1
        return moved

    def run(self) -> None:
        """Forward until stop()."""
        while not self._stop.is_set():
            self.forward_once()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self.a.close()
        self.b.close()
