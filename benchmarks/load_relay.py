"""Load harness: 1,000+ synthetic nodes against one relay, or against three federated relays.

    python -m benchmarks.load_relay [--nodes 1000] [--period 8] [--k 4] [--seconds 60]
                                    [--relays 1|3] [--procs 4] [--audit 2] [--clients swarm|bare] [--json PATH]

No models. By default (--clients swarm) every node is a real `SwarmClient` (decode=False):
the node's own I/O thread, acks, retries, `busy` back-off and its keep-alive (a PING every
heartbeat_s = 1 s, as a node sends), spread over several processes. --clients bare runs
each node as a bare DEALER socket speaking the relay protocol (HELLO, SUB, PUB with retries,
a PING every 5 s), several hundred per process in one poll loop: cheaper for the harness, but
it under-states the keep-alive traffic a relay sees from real nodes.
Payloads are real encoded rollouts (ftis_edge.rollout.wire, 8 completions x 128 tokens from the
SmolLM2 fixture, ~4 KB), each with a fresh rollout id that carries its publish time.

Each node publishes one group every --period s (random phase) and subscribes with budget K per
window of --period s. --audit extra nodes per relay subscribe to everything: every rollout the
relays ACKed must reach each of them (`lost` counts the ones that did not). With --relays 3 the
relays form a line A-B-C joined by two `ftis-relay bridge` processes and nodes are spread over
all three.

Prints deliveries/s, egress MB/s (relay-side out_bytes), per-node download, p50/p99 delivery
latency (publish -> arrival), relay CPU (% of one core) and RSS, busy NACKs, and rollouts lost.
"""
from __future__ import annotations

import heapq
import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import orjson
import zmq

from benchmarks.harness import ROOT, parser, vm_bytes, write_json
from ftis_edge.common.ports import free_port
from relay import protocol as P
from relay.cli import query_stats

_TS = struct.Struct("<d")


def templates() -> list[bytes]:
    """Real encoded groups (the codec's own output) to patch fresh ids into."""
    from benchmarks.bench_wire import fixture_rollouts
    from ftis_edge.rollout import wire
    out = []
    for r in fixture_rollouts():
        r.rollout_id = os.urandom(16).hex()        # a 32-char hex id: 16 raw bytes in the prefix
        out.append(wire.encode(r))
    return out


def stamp(template: bytes) -> tuple[bytes, bytes]:
    """A copy with a fresh id whose first 8 bytes are the publish time; (rollout id, message)."""
    msg = bytearray(template)
    off = P.peek_rollout(template).payload_offset - 4 - 16
    msg[off:off + 16] = _TS.pack(time.time()) + os.urandom(8)
    return bytes(msg[off:off + 16]).hex().encode(), bytes(msg)


def sent_at(rid: bytes) -> float:
    return _TS.unpack(bytes.fromhex(rid[:16].decode()))[0]


class Node:
    __slots__ = ("name", "sock", "pending", "acked", "seen", "busy_until", "got", "got_in", "nbytes", "lat")

    def __init__(self, name: str, sock: zmq.Socket):
        self.name, self.sock = name, sock
        self.pending: dict[bytes, list] = {}     # rid -> [msg, not_before, last_sent]
        self.acked: list[bytes] = []            # ids the relay ACKed to this node
        self.seen: list[bytes] = []             # ids delivered to it (kept for audit nodes only)
        self.busy_until = 0.0
        self.got = 0
        self.got_in = 0                          # ... of which arrived while publishing went on
        self.nbytes = 0
        self.lat: list[float] = []


def run_nodes(addresses: list[str], names: list[str], k: int, period: float, seconds: float,
              publish: bool, go, out) -> None:
    """One harness process: many nodes in one poll loop."""
    tpl = templates()
    ctx = zmq.Context()
    poller = zmq.Poller()
    nodes, by_sock = [], {}
    for i, name in enumerate(names):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 10_000)
        s.connect(addresses[i % len(addresses)])
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})])
        sub = {"epoch": None, "last_seq": 0}
        if k:
            sub["budget"] = {"k": k, "window_s": period}
        s.send_multipart([P.SUB, b"swarm", orjson.dumps(sub)])
        n = Node(name, s)
        nodes.append(n)
        by_sock[s] = n
        poller.register(s, zmq.POLLIN)
    go.wait()
    t0 = time.time()
    sched = [(t0 + random.uniform(0, period), i) for i in range(len(nodes))] if publish else []
    heapq.heapify(sched)
    next_ping = t0 + 5.0
    stop_pub, stop_all = t0 + seconds, t0 + seconds + 20.0
    while time.time() < stop_all:
        now = time.time()
        while sched and sched[0][0] <= now:
            t, i = heapq.heappop(sched)
            if t < stop_pub:
                n = nodes[i]
                rid, msg = stamp(tpl[random.randrange(len(tpl))])
                n.pending[rid] = [msg, 0.0, 0.0]
                heapq.heappush(sched, (t + period, i))
        for n in nodes:                       # (re)send what is due
            if n.pending and now >= n.busy_until:
                for rid, p in n.pending.items():
                    if now >= p[1] and (p[2] == 0.0 or now - p[2] > 5.0):
                        try:
                            n.sock.send_multipart([P.PUB, b"swarm", p[0]], zmq.NOBLOCK)
                            p[2] = now
                        except zmq.Again:
                            break
        if now >= next_ping:
            next_ping = now + 5.0
            for n in nodes:
                n.sock.send_multipart([P.PING, b'{"t": 0}'], zmq.NOBLOCK)
        for s, _ in poller.poll(20):
            n = by_sock[s]
            for _ in range(500):
                try:
                    f = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                kind = f[0]
                if kind == P.DELIVER:
                    _, _, _, _, rid, _, payload = P.unpack_deliver(f[1])
                    n.got += 1
                    n.nbytes += len(payload)
                    t = time.time()
                    if t < stop_pub:              # steady state only, not the drain after it
                        n.got_in += 1
                        n.lat.append(t - sent_at(rid))
                    if not publish:
                        n.seen.append(rid)           # audit nodes: remember what arrived
                elif kind == P.MARK and f[1]:       # prove what it read, as the real client does
                    n.sock.send_multipart([P.PING, orjson.dumps({"t": 0, "mark": f[1].hex()})], zmq.NOBLOCK)
                elif kind == P.ACK:
                    if n.pending.pop(f[1], None) is not None:
                        n.acked.append(f[1])
                elif kind == P.NACK and f[1] in n.pending:
                    wait = 0.25
                    if len(f) == 4:
                        wait = float(orjson.loads(f[3]).get("retry_after_s", wait))
                    n.pending[f[1]][1] = now + wait * random.uniform(1, 1.5)
                    n.pending[f[1]][2] = 0.0
                    if f[2] == b"busy":
                        n.busy_until = now + wait
    lat = np.concatenate([np.array(n.lat) for n in nodes]) if nodes else np.zeros(0)
    out.put({"publish": publish, "k": k, "nodes": len(nodes),
             "acked": [r for n in nodes for r in n.acked], "seen": [[r for r in n.seen] for n in nodes],
             "unacked": sum(len(n.pending) for n in nodes),
             "got": [n.got for n in nodes], "got_in": [n.got_in for n in nodes], "bytes": sum(n.nbytes for n in nodes),
             "lat": lat.tolist() if len(lat) <= 200_000 else np.random.choice(lat, 200_000).tolist()})
    for n in nodes:
        n.sock.send_multipart([P.BYE], zmq.NOBLOCK)
        n.sock.close(0)
    ctx.term()


def run_swarm_clients(addresses: list[str], names: list[str], k: int, period: float, seconds: float,
                      publish: bool, go, out) -> None:
    """One harness process: real SwarmClients (their own I/O threads and keep-alive)."""
    from ftis_edge.peers.swarm import SwarmClient
    tpl = templates()
    clients = [SwarmClient(addresses[i % len(addresses)], swarm="swarm", node_id=name, decode=False,
                           budget_k=k, budget_window_s=period, warn_every_s=1e9).start()
               for i, name in enumerate(names)]
    go.wait()
    t0 = time.time()
    sched = [(t0 + random.uniform(0, period), i) for i in range(len(clients))] if publish else []
    heapq.heapify(sched)
    stop_pub, stop_all = t0 + seconds, t0 + seconds + 20.0
    got, got_in, nbytes = [0] * len(clients), [0] * len(clients), 0
    seen: list[list[bytes]] = [[] for _ in clients]
    lat: list[float] = []
    while time.time() < stop_all:
        now = time.time()
        while sched and sched[0][0] <= now:
            t, i = heapq.heappop(sched)
            if t < stop_pub:
                clients[i].publish_bytes(stamp(tpl[random.randrange(len(tpl))])[1])
                heapq.heappush(sched, (t + period, i))
        for i, c in enumerate(clients):
            for d in c.poll():
                t = time.time()
                got[i] += 1
                nbytes += d.nbytes
                if t < stop_pub:
                    got_in[i] += 1
                    lat.append(t - sent_at(d.rollout_id.encode()))
                if not publish:
                    seen[i].append(d.rollout_id.encode())
        time.sleep(0.02)
    acked = [rid.encode() for c in clients for rid in c.acked_ids()]
    unacked = sum(c.pending() for c in clients)
    for c in clients:
        c.close()
    out.put({"publish": publish, "k": k, "nodes": len(clients), "acked": acked, "seen": seen,
             "unacked": unacked, "got": got, "got_in": got_in, "bytes": nbytes,
             "lat": lat if len(lat) <= 200_000 else random.sample(lat, 200_000)})


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, default=1000, help="synthetic nodes (publish and subscribe with budget K)")
    ap.add_argument("--period", type=float, default=8.0, help="s between one node's groups; also the budget window")
    ap.add_argument("--k", type=int, default=4, help="delivery budget K per window (0 = everything)")
    ap.add_argument("--seconds", type=float, default=60.0, help="publishing time")
    ap.add_argument("--relays", type=int, default=1, choices=(1, 3), help="one relay, or three in a line")
    ap.add_argument("--procs", type=int, default=4, help="harness processes for the nodes")
    ap.add_argument("--audit", type=int, default=1, help="everything-subscribers per relay (loss check)")
    ap.add_argument("--clients", choices=("swarm", "bare"), default="swarm",
                    help="real SwarmClients (the node's keep-alive) or bare DEALER sockets")
    args = ap.parse_args(argv)

    addrs = [f"tcp://127.0.0.1:{free_port()}" for _ in range(args.relays)]
    relays = [subprocess.Popen([sys.executable, "-m", "relay", "--bind", a, "--log-level", "WARNING",
                                "--trust-bridge", "b1", "--trust-bridge", "b2", "--open-bridges"], cwd=ROOT) for a in addrs]
    bridges = []
    try:
        for a in addrs:
            for _ in range(100):
                try:
                    query_stats(a, timeout_s=0.5)
                    break
                except TimeoutError:
                    pass
        for i in range(args.relays - 1):
            bridges.append(subprocess.Popen([sys.executable, "-m", "relay", "bridge", addrs[i], addrs[i + 1],
                                             "--swarm", "swarm", "--node-id", f"b{i + 1}", "--log-level", "WARNING"],
                                            cwd=ROOT))
        ctx = mp.get_context("spawn")
        go, out = ctx.Event(), ctx.Queue()
        names = [f"n{i:05d}" for i in range(args.nodes)]
        chunks = [names[i::args.procs] for i in range(args.procs)]
        node = run_swarm_clients if args.clients == "swarm" else run_nodes
        workers = [ctx.Process(target=node, args=(addrs, ch, args.k, args.period, args.seconds, True, go, out))
                   for ch in chunks]
        audit_names = [f"audit{i}" for i in range(args.audit * args.relays)]    # round-robin over relays
        workers.append(ctx.Process(target=node, args=(addrs, audit_names, 0, args.period, args.seconds,
                                                      False, go, out)))
        for w in workers:
            w.start()
        time.sleep(5.0 + args.nodes / 400)      # connections, HELLOs and SUBs land
        cpu0 = [_cpu_s(r.pid) for r in relays]
        t0 = time.time()
        go.set()
        time.sleep(args.seconds)                # measure the relays over the publishing time
        dt_pub = time.time() - t0
        cpu = [(_cpu_s(r.pid) - c0) / dt_pub for r, c0 in zip(relays, cpu0)]
        stats0 = [query_stats(a, timeout_s=10) for a in addrs]
        rss = [vm_bytes(r.pid, "VmRSS") / 2**20 for r in relays]
        results = [out.get(timeout=args.seconds + 120) for _ in workers]
        stats = [query_stats(a, timeout_s=10) for a in addrs]
        hwm = [vm_bytes(r.pid) / 2**20 for r in relays]
        for w in workers:
            w.join(30)
    finally:
        for p in bridges + relays:
            p.send_signal(signal.SIGTERM)
        for p in bridges + relays:
            p.wait(10)

    pubs = [r for r in results if r["publish"]]
    audits = [r for r in results if not r["publish"]]
    acked = {rid for r in pubs for rid in r["acked"]}
    seen = [set(s) for a in audits for s in a["seen"]]
    per_audit_lost = [len(acked - s) for s in seen]
    per_audit_dup = [len(s_list) - len(set(s_list)) for a in audits for s_list in a["seen"]]
    got = np.array([g for r in pubs for g in r["got"]])
    got_in = np.array([g for r in pubs for g in r["got_in"]])
    lat = np.array([x for r in pubs for x in r["lat"]]) * 1e3          # budgeted nodes
    lat_audit = np.array([x for r in audits for x in r["lat"]]) * 1e3  # everything-subscribers
    deliveries = int(sum(sum(r["got_in"]) for r in results))
    egress = sum(s["counts"]["delivered_bytes"] for s in stats0)
    busy = sum(s["rejected"].get("busy", 0) for s in stats)
    windows = dt_pub / args.period
    pub_bytes = sum(r["bytes"] for r in pubs)
    print(f"load: {args.nodes} {'real SwarmClient' if args.clients == 'swarm' else 'bare-socket'} nodes, 1 group / {args.period:g} s each, K = {args.k or 'all'} per "
          f"{args.period:g} s, {args.relays} relay(s){' in a line' if args.relays == 3 else ''}, "
          f"{dt_pub:.0f} s, {args.procs} harness processes + {len(audit_names)} audit subscriber(s); "
          f"payload ~{np.mean([len(t) for t in templates()]) / 1024:.1f} KB real encoded groups; "
          f"{os.cpu_count()} CPUs shared with other jobs")
    print(f"published+ACKed {len(acked)} (unacked at end {sum(r['unacked'] for r in pubs)}), busy NACKs {busy}")
    print(f"deliveries/s {deliveries / dt_pub:.0f}   egress {egress / dt_pub / 1e6:.2f} MB/s   "
          f"per-node download {got_in.mean() * pub_bytes / max(1, got.sum()) / dt_pub / 1024 if len(got) else 0:.2f} KB/s "
          f"({got_in.mean() / windows if len(got) else 0:.2f} groups per node per {args.period:g} s, K = {args.k}; "
          f"relay windows start at each node's SUB, so a run spans one window more)")
    print(f"latency p50 {np.percentile(lat, 50):.0f} ms   p99 {np.percentile(lat, 99):.0f} ms   (publish -> arrival, "
          f"budgeted nodes); everything-subscribers p50 {np.percentile(lat_audit, 50):.0f} ms "
          f"p99 {np.percentile(lat_audit, 99):.0f} ms")
    for i, s in enumerate(stats):
        print(f"relay {i}: CPU {cpu[i] * 100:.0f}% of a core, RSS {rss[i]:.0f} MB (peak {hwm[i]:.0f} MB), "
              f"accepted {s['counts'].get('accepted', 0)}, rejected {s['rejected']}, "
              f"skipped_slow {s['counts'].get('skipped_slow', 0)}")
    print(f"rollouts lost (ACKed, not at an everything-subscriber): {per_audit_lost}, "
          f"duplicates there: {per_audit_dup}  ({len(acked)} ACKed)")
    write_json(args.json, {"nodes": args.nodes, "clients": args.clients, "relays": args.relays, "k": args.k, "period": args.period,
                        "acked": len(acked), "deliveries_s": deliveries / dt_pub, "egress_mb_s": egress / dt_pub / 1e6,
                        "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                        "cpu": cpu, "rss_mb": rss, "hwm_mb": hwm, "lost": per_audit_lost, "dup": per_audit_dup,
                        "busy": busy})
    return 0


if __name__ == "__main__":
    sys.exit(main())
