"""`ftis-relay`: run a relay, make CURVE keys, or print a running relay's stats.

    ftis-relay --bind tcp://0.0.0.0:5555 [--keys DIR --allow DIR]     (same as `ftis-relay serve ...`)
    ftis-relay keygen DIR [--name NAME]
    ftis-relay status --connect tcp://host:5555 [--keys DIR --server-key FILE] [--json]
    ftis-relay bridge --swarm S --node-id ID tcp://relay-a:5555 tcp://relay-b:5555   (federation)
"""
from __future__ import annotations

import argparse
import logging
import sys

import orjson
import zmq

from relay import protocol as P
from relay.keys import ClientKeys, KeyError_, keygen
from relay.server import RelayConfig, run


def _serve_parser(p: argparse.ArgumentParser) -> None:
    d = RelayConfig()
    p.add_argument("--bind", default=d.bind, help="ZeroMQ endpoint to listen on")
    p.add_argument("--keys", help="directory with the relay's server.key_secret (enables CURVE)")
    p.add_argument("--allow", help="directory of allowed client public certificates (*.key)")
    p.add_argument("--replay", type=int, default=d.replay_count, help="replay buffer, rollouts per topic")
    p.add_argument("--replay-mb", type=float, default=d.replay_bytes / 2**20, help="replay buffer, MiB per topic")
    p.add_argument("--max-msg-kb", type=float, default=d.max_message_bytes / 1024, help="largest rollout")
    p.add_argument("--rate", type=float, default=d.rate_msgs, help="per node rollouts/s (0 = unlimited)")
    p.add_argument("--burst", type=float, default=d.rate_burst, help="per node burst, rollouts")
    p.add_argument("--rate-mb", type=float, default=d.rate_bytes / 2**20, help="per node MiB/s (0 = unlimited)")
    p.add_argument("--peer-timeout", type=float, default=d.peer_timeout_s, help="forget silent clients after s")
    p.add_argument("--sndhwm", type=int, default=d.sndhwm, help="messages queued per client before it counts as slow")
    p.add_argument("--trust-bridge", action="append", default=[], metavar="NODE_ID",
                   help="node id of a federation bridge allowed to forward others' rollouts (repeatable)")
    p.add_argument("--log-level", default="INFO")


def _serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if bool(args.keys) != bool(args.allow):
        print("ftis-relay: --keys and --allow go together (CURVE needs both)", file=sys.stderr)
        return 2
    cfg = RelayConfig(bind=args.bind, keys_dir=args.keys, allow_dir=args.allow,
                      replay_count=args.replay, replay_bytes=int(args.replay_mb * 2**20),
                      max_message_bytes=int(args.max_msg_kb * 1024), rate_msgs=args.rate,
                      rate_burst=args.burst, rate_bytes=args.rate_mb * 2**20,
                      peer_timeout_s=args.peer_timeout, sndhwm=args.sndhwm,
                      trusted_bridges=frozenset(b.encode() for b in args.trust_bridge))
    try:
        return run(cfg)
    except (KeyError_, ValueError) as e:
        print(f"ftis-relay: {e}", file=sys.stderr)
        return 2
    except zmq.ZMQError as e:
        print(f"ftis-relay: cannot bind {args.bind}: {e}", file=sys.stderr)
        return 2


def query_stats(address: str, keys: ClientKeys | None = None, timeout_s: float = 3.0) -> dict:
    """Ask a relay for its stats; raises TimeoutError when it does not answer."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if keys:
        keys.apply(s)
    s.connect(address)
    try:
        s.send_multipart([P.STATS])
        if not s.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer from {address} within {timeout_s} s")
        frames = s.recv_multipart()
        if frames[0] != P.STATS or len(frames) != 2:
            raise TimeoutError(f"unexpected reply from {address}: {frames[0][:20]!r}")
        return orjson.loads(frames[1])
    finally:
        s.close(0)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_stats(s: dict) -> str:
    lines = [f"relay epoch {s['epoch']}  up {s['uptime_s']:.0f} s  bind {s['bind']}  curve {s['curve']}",
             f"counts: {s['counts']}", f"rejected: {s['rejected'] or '{}'}", "",
             f"{'topic':<24}{'next_seq':>10}{'buffered':>10}{'bytes':>12}{'subs':>6}"]
    for name, t in s["topics"].items():
        lines.append(f"{name[:23]:<24}{t['next_seq']:>10}{t['buffered']:>10}"
                     f"{_fmt_bytes(t['buffer_bytes']):>12}{t['subscribers']:>6}")
    lines += ["", f"{'peer':<20}{'in msgs':>9}{'in':>10}{'out msgs':>10}{'out':>10}{'acked':>7}"
                  f"{'nacked':>7}{'lag':>6}{'skipped':>8}{'seen s':>8}"]
    for p in s["peers"]:
        lines.append(f"{p['node_id'][:19]:<20}{p['in_msgs']:>9}{_fmt_bytes(p['in_bytes']):>10}"
                     f"{p['out_msgs']:>10}{_fmt_bytes(p['out_bytes']):>10}{p['acked']:>7}{p['nacked']:>7}"
                     f"{p['lag']:>6}{p['skipped']:>8}{p['last_seen_s']:>8.1f}")
    return "\n".join(lines)


def _status(args) -> int:
    keys = None
    try:
        if args.keys or args.server_key:
            if not (args.keys and args.server_key):
                print("ftis-relay status: --keys and --server-key go together", file=sys.stderr)
                return 2
            keys = ClientKeys.load(args.keys, args.server_key)
        s = query_stats(args.connect, keys, args.timeout)
    except (TimeoutError, KeyError_) as e:
        print(f"ftis-relay status: {e}", file=sys.stderr)
        return 1
    print(orjson.dumps(s, option=orjson.OPT_INDENT_2).decode() if args.json else format_stats(s))
    return 0


def _bridge(args) -> int:
    import signal
    from relay.bridge import Bridge
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        keys_a = ClientKeys.load(args.keys, args.server_key_a) if args.server_key_a else None
        keys_b = ClientKeys.load(args.keys, args.server_key_b) if args.server_key_b else None
    except (KeyError_, TypeError) as e:
        print(f"ftis-relay bridge: {e} (--server-key-a/-b need --keys)", file=sys.stderr)
        return 2
    bridge = Bridge(args.a, args.b, swarm=args.swarm, node_id=args.node_id, keys_a=keys_a, keys_b=keys_b)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: bridge.stop())
    bridge.start()
    logging.getLogger("ftis-relay.bridge").info("bridging swarm %s: %s <-> %s", args.swarm, args.a, args.b)
    try:
        bridge.run()
    finally:
        bridge.close()
        logging.getLogger("ftis-relay.bridge").info("bridge stopped: %s", bridge.forwarded)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "keygen":
        p = argparse.ArgumentParser(prog="ftis-relay keygen", description="create a CURVE key pair")
        p.add_argument("dir")
        p.add_argument("--name", default="server", help="file stem: NAME.key and NAME.key_secret")
        a = p.parse_args(argv[1:])
        pub, sec = keygen(a.dir, a.name)
        print(f"public key: {pub}\nsecret key: {sec}  (keep it private)")
        return 0
    if argv and argv[0] == "status":
        p = argparse.ArgumentParser(prog="ftis-relay status", description="print a relay's stats")
        p.add_argument("--connect", default="tcp://127.0.0.1:5555")
        p.add_argument("--keys", help="client key directory (NAME.key_secret) when the relay uses CURVE")
        p.add_argument("--server-key", help="the relay's public certificate (server.key)")
        p.add_argument("--timeout", type=float, default=3.0)
        p.add_argument("--json", action="store_true")
        return _status(p.parse_args(argv[1:]))
    if argv and argv[0] == "bridge":
        p = argparse.ArgumentParser(prog="ftis-relay bridge", description="join one swarm across two relays "
                                    "(each relay must run with --trust-bridge NODE_ID)")
        p.add_argument("a", help="first relay, e.g. tcp://relay-a:5555")
        p.add_argument("b", help="second relay")
        p.add_argument("--swarm", required=True)
        p.add_argument("--node-id", required=True, help="the bridge's node id (as trusted by both relays)")
        p.add_argument("--keys", help="the bridge's client key directory (CURVE)")
        p.add_argument("--server-key-a", help="relay A's public certificate")
        p.add_argument("--server-key-b", help="relay B's public certificate")
        p.add_argument("--log-level", default="INFO")
        return _bridge(p.parse_args(argv[1:]))
    if argv and argv[0] == "serve":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="ftis-relay", description="the ftis-edge ZeroMQ relay "
                                "(subcommands: serve [default], keygen, status, bridge)")
    _serve_parser(p)
    return _serve(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
