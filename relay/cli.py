"""`ftis-relay`: run a relay, make CURVE keys, or print a running relay's stats.

    ftis-relay --bind tcp://0.0.0.0:5555 [--keys DIR --allow DIR]     (same as `ftis-relay serve ...`)
    ftis-relay keygen DIR [--name NAME]
    ftis-relay status --connect tcp://host:5555 [--keys DIR --server-key FILE] [--json]
    ftis-relay bridge --swarm S --node-id ID tcp://relay-a:5555 tcp://relay-b:5555   (federation)
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import time

import orjson
import zmq
from zmq.utils.monitor import recv_monitor_message

from relay import protocol as P
from relay.keys import ClientKeys, KeyFileError, keygen
from relay.config import RelayConfig
from relay.server import Relay
from relay.text_safety import terminal_safe

_FMT = argparse.ArgumentDefaultsHelpFormatter
log = logging.getLogger("ftis-relay")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every flag's help, and the subcommand list kept as written."""

SUBCOMMANDS = """subcommands:
  serve     run a relay (the default: `ftis-relay --bind ...` is `ftis-relay serve --bind ...`)
  keygen    create a CURVE key pair:        ftis-relay keygen DIR [--name NAME]
  status    print a running relay's stats:  ftis-relay status --connect tcp://host:5555
  bridge    join one swarm across relays:   ftis-relay bridge --swarm S --node-id ID tcp://A tcp://B
run `ftis-relay SUBCOMMAND --help` for each one's flags."""


def _serve_parser(p: argparse.ArgumentParser) -> None:
    d = RelayConfig()
    p.add_argument("--bind", default=d.bind, help="ZeroMQ endpoint to listen on (tcp://HOST:PORT)")
    p.add_argument("--keys", help="directory with the relay's server.key_secret (enables CURVE; needs --allow)")
    p.add_argument("--allow", help="directory of allowed client certificates; NAME.key may connect as node NAME only")
    p.add_argument("--replay", type=int, default=d.replay_count, help="replay buffer, rollouts per topic")
    p.add_argument("--replay-mb", type=float, default=d.replay_bytes / 2**20, help="replay buffer, MiB per topic")
    p.add_argument("--max-msg-kb", type=float, default=d.max_message_bytes / 1024, help="largest rollout, KiB")
    p.add_argument("--rate", type=float, default=d.rate_msgs,
                   help="rollouts/s per connection and per node id (per key on CURVE); 0 = unlimited")
    p.add_argument("--burst", type=float, default=d.rate_burst, help="burst for --rate, rollouts")
    p.add_argument("--rate-mb", type=float, default=d.rate_bytes / 2**20,
                   help="MiB/s per connection and per node id; 0 = unlimited")
    p.add_argument("--accept-rate", type=float, default=d.accept_rate,
                   help="rollouts/s accepted from all publishers together (beyond: NACK busy); 0 = unlimited")
    p.add_argument("--accept-burst", type=float, default=d.accept_burst, help="burst for --accept-rate, rollouts")
    p.add_argument("--max-topics", type=int, default=d.max_topics, help="topics (swarms) in total")
    p.add_argument("--max-topics-per-peer", type=int, default=d.max_topics_per_peer,
                   help="topics one connection may publish or subscribe to")
    p.add_argument("--max-peers", type=int, default=d.max_peers, help="connections that said HELLO")
    p.add_argument("--slow-after", type=float, default=d.slow_after_s,
                   help="s a subscriber's pipe may stay full (while another's is not) before it stops "
                        "holding the buffer (then it skips)")
    p.add_argument("--busy-retry", type=float, default=d.busy_retry_s, help="retry-after sent with NACK busy, s")
    p.add_argument("--peer-timeout", type=float, default=d.peer_timeout_s,
                   help="forget (and cut) a client silent, or holding queued bytes with no read proven, this many s")
    p.add_argument("--sndhwm", type=int, default=d.sndhwm, help="messages queued per client before it counts as blocked")
    p.add_argument("--max-queued-mb", type=float, default=d.max_queued_bytes / 2**20,
                   help="rollout MB sent to a client and not proven read (it echoes the relay's MARKs) "
                        "before it is held back; 0 = unbounded")
    p.add_argument("--max-total-queued-mb", type=float, default=d.max_total_queued_bytes / 2**20,
                   help="the same for all clients together; past it each gets only its share; 0 = unbounded")
    p.add_argument("--trust-bridge", action="append", default=[], metavar="NAME[=RELAY,...]",
                   help="federation bridge allowed to forward others' rollouts (repeatable): its node id, "
                        "which on a CURVE relay is its key's name; =RELAY,... limits the relays whose nodes "
                        "(NODE@RELAY) it may forward")
    # its default is worked out at start (HOST:PORT), so the help says that and not an empty default
    p.add_argument("--name", default=d.name, help="this relay's name: its nodes are NODE@NAME on other relays "
                                                  "(default: HOST:PORT)" + "%(default).0s")
    p.add_argument("--open-bridges", action="store_true",
                   help="honour --trust-bridge on an open relay (no --keys), where a node id is only a claim: "
                        "anyone who says HELLO as a trusted name may then publish as any node")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")


def _serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if bool(args.keys) != bool(args.allow):
        print("ftis-relay: --keys and --allow go together (CURVE needs both)", file=sys.stderr)
        return 2
    hint = P.check_bind(args.bind)
    if hint:
        print(f"ftis-relay: --bind {hint}", file=sys.stderr)
        return 2
    cfg = RelayConfig(bind=args.bind, keys_dir=args.keys, allow_dir=args.allow,
                      replay_count=args.replay, replay_bytes=int(args.replay_mb * 2**20),
                      max_message_bytes=int(args.max_msg_kb * 1024), rate_msgs=args.rate,
                      rate_burst=args.burst, rate_bytes=args.rate_mb * 2**20,
                      accept_rate=args.accept_rate, accept_burst=args.accept_burst,
                      max_topics=args.max_topics, max_topics_per_peer=args.max_topics_per_peer,
                      max_peers=args.max_peers, slow_after_s=args.slow_after, busy_retry_s=args.busy_retry,
                      peer_timeout_s=args.peer_timeout, sndhwm=args.sndhwm,
                      max_queued_bytes=int(args.max_queued_mb * 2**20),
                      max_total_queued_bytes=int(args.max_total_queued_mb * 2**20),
                      trusted_bridges=frozenset(args.trust_bridge), open_bridges=args.open_bridges,
                      name=args.name)
    try:
        return run(cfg)
    except (KeyFileError, ValueError) as e:
        print(f"ftis-relay: {e}", file=sys.stderr)
        return 2
    except zmq.ZMQError as e:
        print(f"ftis-relay: cannot bind {args.bind}: {e}", file=sys.stderr)
        return 2


STATUS_NODE_ID = "ftis-relay-status"     # the node id `status` says HELLO as on an open relay


def query_stats(address: str, keys: ClientKeys | None = None, timeout_s: float = 3.0) -> dict:
    """Ask a relay for its stats; raises TimeoutError when it does not answer (saying so when
    the handshake failed: the relay needs CURVE keys, or refused ours)."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if keys:
        keys.apply(s)
    mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                               | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    s.connect(address)
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    poller.register(mon, zmq.POLLIN)
    failed = ""
    try:
        if keys is None:      # an open relay answers STATS (O(peers) bytes) only after a HELLO
            s.send_multipart([P.HELLO, orjson.dumps({"node_id": STATUS_NODE_ID, "protocol": P.RELAY_PROTOCOL})])
        s.send_multipart([P.STATS])
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            events = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
            if mon in events:
                ev = recv_monitor_message(mon)
                failed = ("the relay refused this key (not in its --allow dir)"
                          if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                          "the handshake failed: the relay may need keys (--keys DIR --server-key FILE)"
                          if keys is None else
                          "the CURVE handshake failed: wrong --server-key, or the relay runs without CURVE")
                continue
            if s in events:
                frames = s.recv_multipart()
                if frames[0] in (P.WELCOME, P.MARK):   # the answer to our HELLO, a receipt asked: STATS follows
                    continue
                break
            if left <= 0:
                msg = f"no answer from {address} within {timeout_s} s"
                raise TimeoutError(f"{msg}: {failed}" if failed else
                                   msg + ("" if keys else " (is it running? if it uses CURVE, pass --keys and --server-key)"))
        if frames[0] != P.STATS or len(frames) != 2:
            raise TimeoutError(f"unexpected reply from {address}: {b' '.join(frames)[:60]!r}")
        # the relay counts its replies until they are proven read: echo the MARK it sends after
        # STATS in our BYE, so that it does not keep them as a ghost's
        mark = b""
        if s.poll(300):
            got = s.recv_multipart()
            mark = got[1] if got[0] == P.MARK and len(got) == 2 else b""
        s.send_multipart([P.BYE, orjson.dumps({"mark": mark.hex()})], zmq.NOBLOCK)
        return orjson.loads(frames[1])
    finally:
        s.disable_monitor()
        mon.close(0)
        s.close(0)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _safe(value) -> str:
    """A peer-chosen string (node id, topic, key name) as visible text: no escape sequence,
    clipboard write or bidi override reaches the operator's terminal."""
    return terminal_safe(str(value))


def format_stats(s: dict) -> str:
    q = s.get("queued") or {}
    held = [p for p in s["peers"] if p.get("held_back")]
    lines = [f"relay epoch {s['epoch']}  up {s['uptime_s']:.0f} s  bind {s['bind']}  curve {s['curve']}",
             f"identity: {s.get('identity', '?')}",
             f"counts: {s['counts']}", f"rejected: {s['rejected'] or '{}'}",
             f"refused handshakes: {s.get('refused_handshakes') or '{}'}",
             f"queued: {_fmt_bytes(q.get('bytes', 0))} of {_fmt_bytes(q.get('cap', 0))} "
             f"(each peer at most {_fmt_bytes(q.get('peer_cap', 0))}; {q.get('ghosts', 0)} gone peers hold "
             f"{_fmt_bytes(q.get('ghost_bytes', 0))})",
             "held back (sent more than they proved they read): " + (", ".join(
                 f"{_safe(p['node_id'])} ({_fmt_bytes(p.get('queued_bytes', 0))}, {p['held_back']})"
                 for p in held) or "none"), "",
             f"{'topic':<24}{'next_seq':>10}{'buffered':>10}{'bytes':>12}{'subs':>6}"]
    for name, t in s["topics"].items():
        lines.append(f"{_safe(name)[:23]:<24}{t['next_seq']:>10}{t['buffered']:>10}"
                     f"{_fmt_bytes(t['buffer_bytes']):>12}{t['subscribers']:>6}")
    shown, total = s.get("peers_shown"), s.get("peers_total")
    lines += ["", *([f"({shown} of {total} peers shown: the rest did not fit this reply)"]
                    if shown is not None and total is not None and shown < total else []),
              f"{'peer':<20}{'in msgs':>9}{'in':>10}{'out msgs':>10}{'out':>10}{'acked':>7}"
                  f"{'nacked':>7}{'lag':>6}{'skipped':>8}{'seen s':>8}"]
    for p in s["peers"]:
        lines.append(f"{_safe(p['node_id'])[:19]:<20}{p['in_msgs']:>9}{_fmt_bytes(p['in_bytes']):>10}"
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
    except (TimeoutError, KeyFileError) as e:
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
    except (KeyFileError, TypeError) as e:
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
        logging.getLogger("ftis-relay.bridge").info("bridge stopped: %s", orjson.dumps(bridge.forwarded).decode())
    return 0


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
        log.info("relay stopped after %.0f s: %d messages accepted; %s", s["uptime_s"],
                 s["counts"].get("accepted", 0),
                 _rejected_in_words(s["rejected"], s.get("refused_handshakes") or {}, relay.refusal_lines.held()))
        relay.close()
    return 0


_HANDSHAKE_WORDS = {"bad_handshake": "CURVE failed: wrong server key?", "no_curve": "no CURVE keys",
                    "unknown_key": "key not in the allow list", "aborted": "aborted by the client"}


def _rejected_in_words(rejected: dict, handshakes: dict | None = None, held_lines: int = 0) -> str:
    """`{'ping_rate': 100}` as an operator reads it: "100 refused (100 over the ping rate)"; the
    refused handshakes after it (they were "none refused" before, issue 63.6), with how many of
    their log lines were held back."""
    total = sum(int(n) for n in rejected.values())
    parts = ", ".join(f"{int(n)} {terminal_safe(str(reason)).replace('_', ' ')}"
                      for reason, n in sorted(rejected.items(), key=lambda kv: -int(kv[1])))
    words = f"{total} refused ({parts})" if total else "none refused"
    shakes = sum(int(n) for n in (handshakes or {}).values())
    if not shakes:
        return words
    why = ", ".join(f"{int(n)} {_HANDSHAKE_WORDS.get(k, terminal_safe(str(k)).replace('_', ' '))}"
                    for k, n in sorted(handshakes.items(), key=lambda kv: -int(kv[1])))
    held = f"; {held_lines} repeated log lines held back" if held_lines else ""
    return f"{words}; {shakes} handshakes refused ({why}{held})"


def _exit_later(delay_s: float) -> None:
    time.sleep(delay_s)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv and argv[0] in ("serve", "keygen", "status", "bridge") else None
    rest = argv[1:] if cmd else argv
    if cmd == "keygen":
        p = argparse.ArgumentParser(prog="ftis-relay keygen", formatter_class=_FMT,
                                    description="create a CURVE key pair: DIR/NAME.key (public) and "
                                                "DIR/NAME.key_secret (keep it private)")
        p.add_argument("dir", help="directory to write the key pair into (created if missing)")
        p.add_argument("--name", default="server",
                       help="file stem: NAME.key and NAME.key_secret; for a node, its node id")
        a = p.parse_args(rest)
        pub, sec = keygen(a.dir, a.name)
        print(f"public key: {pub}\nsecret key: {sec}  (keep it private)")
        return 0
    if cmd == "status":
        p = argparse.ArgumentParser(prog="ftis-relay status", formatter_class=_FMT,
                                    description="print a running relay's stats")
        p.add_argument("--connect", default="tcp://127.0.0.1:5555", help="the relay's address")
        p.add_argument("--keys", help="client key directory (NAME.key_secret) when the relay uses CURVE")
        p.add_argument("--server-key", help="the relay's public certificate (server.key) when it uses CURVE")
        p.add_argument("--timeout", type=float, default=3.0, help="give up after this many seconds")
        p.add_argument("--json", action="store_true", help="print the raw stats as JSON")
        return _status(p.parse_args(rest))
    if cmd == "bridge":
        p = argparse.ArgumentParser(prog="ftis-relay bridge", formatter_class=_FMT,
                                    description="join one swarm across two relays (each relay must run "
                                                "with --trust-bridge NODE_ID)")
        p.add_argument("a", help="first relay, e.g. tcp://relay-a:5555")
        p.add_argument("b", help="second relay, e.g. tcp://relay-b:5555")
        p.add_argument("--swarm", required=True, help="the swarm (topic) to forward")
        p.add_argument("--node-id", required=True, help="the bridge's node id (as trusted by both relays)")
        p.add_argument("--keys", help="the bridge's client key directory (CURVE)")
        p.add_argument("--server-key-a", help="relay A's public certificate (CURVE)")
        p.add_argument("--server-key-b", help="relay B's public certificate (CURVE)")
        p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
        return _bridge(p.parse_args(rest))
    p = argparse.ArgumentParser(prog="ftis-relay" if cmd is None else "ftis-relay serve", formatter_class=_Formatter,
                                description="the ftis-edge ZeroMQ relay: run it, or use a subcommand",
                                epilog=SUBCOMMANDS if cmd is None else None)
    _serve_parser(p)
    return _serve(p.parse_args(rest))


if __name__ == "__main__":
    sys.exit(main())
