"""Who may connect, and as whom: the CURVE allow-list decision (ZAP) and the HELLO identity
rule. `AllowList` and `identity_refusal` are pure (tested without sockets); `ZapAuth` only
plugs the allow-list into pyzmq's ZAP thread."""
from __future__ import annotations

import collections
import logging
import time

from relay import protocol as P
from relay.loglimit import LineLimit, more

alog = logging.getLogger("ftis-relay.auth")


class AllowList:
    """Public key (raw 32 bytes) -> its certificate's name, which is the only node id a
    client with that key may use. Refusals are counted (by reason) and logged at INFO."""

    def __init__(self, names: dict[bytes, str], refused: collections.Counter, lines: LineLimit | None = None):
        self.names, self.refused = names, refused
        self.lines = lines if lines is not None else LineLimit()

    def authorize(self, client_key: bytes, address: str) -> bool:
        if client_key in self.names:
            return True
        from zmq.utils import z85
        self.refused["unknown_key"] += 1
        held = self.lines.check(("unknown_key", client_key, address), time.monotonic())   # a retrying client
        if held is not None:
            alog.info("refused CURVE handshake from %s: key %s is not in the allow list%s",
                      address, z85.encode(client_key).decode(), more(held, self.lines.every_s))
        return False

    def name_of(self, client_key: bytes) -> str:
        return self.names[client_key]


def identity_refusal(curve: bool, node_id: str, key_name: str | None) -> tuple[str, str] | None:
    """(NACK reason, detail) when a HELLO's node id may not be used on this connection: on
    CURVE the key is the identity, so the id must be its certificate's name."""
    if curve and node_id != key_name:
        return P.IDENTITY, f"this key may only connect as {key_name!r}"
    return None


class ZapAuth:
    """pyzmq's ZAP thread, deciding by an AllowList; the key's name becomes the connection's
    User-Id (the relay reads it off HELLO)."""

    def __init__(self, ctx, allow: AllowList):
        from zmq.auth.thread import ThreadAuthenticator

        class Authenticator(ThreadAuthenticator):
            address = ""

            async def handle_zap_message(self, msg):
                self.address = msg[3].decode(errors="replace") if len(msg) > 3 else "?"
                await super().handle_zap_message(msg)

            async def _authenticate_curve(self, domain, client_key):
                return (True, b"OK") if allow.authorize(client_key, self.address) else (False, b"Unknown key")

            def curve_user_id(self, client_public_key):
                return allow.name_of(client_public_key)

        self.allow = allow
        self.thread = Authenticator(ctx, log=logging.getLogger("ftis-relay.zap"))
        self.thread.start()

    def stop(self) -> None:
        self.thread.stop()


def origin_allowed(allowed: frozenset | None, origin: str, relay_name: str) -> bool:
    """A bridged origin is NODE@RELAY (a bridge must not speak for local nodes): never a local
    id (those have no '@', and on CURVE they are keys' names), never this relay's namespace
    (`relay_name`), and one of the bridge's namespaces (`allowed`) when its --trust-bridge names
    them (None: any other relay's)."""
    node, at, ns = origin.partition(P.NAMESPACE)
    # relay names are ASCII: a look-alike (Cyrillic "А" for "A") would pass for another relay
    return bool(node and at and ns) and P.NAMESPACE not in ns and ns != relay_name \
        and ns.isascii() and ns.isprintable() and node.isprintable() \
        and (allowed is None or ns in allowed)


def note_failed_handshakes(monitor, refused: collections.Counter, log: logging.Logger,
                           lines: LineLimit | None = None) -> None:
    """Count and log the handshakes that failed before ZAP (a client without keys, a wrong
    server key): they show only as monitor events. Every one is counted; a line is written
    per kind and endpoint at most every `lines.every_s` (a client retrying ~10 times a second
    wrote a line each time), saying how many like it were held back."""
    lines = lines if lines is not None else LineLimit()
    import zmq
    from zmq.utils.monitor import recv_monitor_message
    while True:
        try:
            ev = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            refused["aborted"] += 1      # the client hung up mid-handshake (which side notices a
            # mechanism mismatch first is a race: a client without keys shows as either)
            held = lines.check(("aborted", ev["endpoint"]), time.monotonic())
            if held is not None:
                log.info("handshake aborted by a client on %s: a client without CURVE keys, or with a "
                         "wrong server key? (errno %s)%s", ev["endpoint"].decode(errors="replace"), ev["value"],
                         more(held, lines.every_s))
            continue
        reason = "no_curve" if ev["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH else "bad_handshake"
        refused[reason] += 1
        # libzmq's monitor names our endpoint, not the client's; ZAP (unknown keys) has both
        held = lines.check((reason, ev["endpoint"]), time.monotonic())
        if held is not None:
            log.info("refused handshake on %s: %s (protocol error %#x)%s", ev["endpoint"].decode(errors="replace"),
                     "the client has no CURVE keys" if reason == "no_curve"
                     else "CURVE failed (wrong server key?)", ev["value"], more(held, lines.every_s))
