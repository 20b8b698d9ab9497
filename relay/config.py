"""The relay's settings (`ftis-relay serve` flags map onto them one to one: relay/cli.py)."""
from __future__ import annotations

from dataclasses import dataclass

from relay import protocol as P


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
    max_queued_bytes: int = 16 << 20       # rollout bytes sent to a client and not proven read (0 = unbounded)
    max_total_queued_bytes: int = 256 << 20   # the same, all clients together (0 = unbounded): past it a
                                           # client gets only its fair share (this / subscribers)
    pump_batch: int = 256                  # deliveries per subscriber per loop turn
    max_peers: int = 10_000                # HELLO floods on an open relay cannot exhaust memory
    max_topics: int = 64                   # topics in total (each holds up to replay_bytes)
    max_topics_per_peer: int = 4           # topics one connection may publish or subscribe to
    slow_after_s: float = 2.0              # a subscriber whose pipe stays full this long stops holding the buffer
    busy_retry_s: float = 0.25             # retry-after sent with NACK busy
    gather_s: float = 0.2                  # budgets: collect candidates this long before a fair pick
    trusted_bridges: frozenset = frozenset()   # node ids (key names on CURVE) allowed to forward others' rollouts
    open_bridges: bool = False             # honour trusted_bridges on an open relay, where a node id is a claim
    name: str = ""                         # this relay's name: bridged ids from here are NODE@name
                                           # ("" = HOST:PORT of bind, with this machine's host name)
