"""ftis-relay vs a raw ZeroMQ XSUB/XPUB proxy, same payloads, loopback only.

    .venv/bin/python -m benchmarks.bench_relay [--pubs 8 --subs 8 --per-pub 300]

Each system moves the same real encoded rollouts (tests/data/real_rollouts.json, ~3.7 KB
each) from P publishers to S subscribers (every subscriber gets every rollout). ftis-relay
does what the raw proxy does not: acks, dedup, rate limits, replay buffer, per-peer stats,
non-blocking fan-out. The relay, the proxy and every client run in their own process (as
nodes do). Prints throughput (rollouts/s delivered to all subscribers, MB/s, from the
go signal to the last delivery) and delivery latency (publish call -> subscriber), p50 / p99,
flat out and at a paced 50 rollouts/s per publisher.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import orjson
import zmq

from benchmarks.bench_wire import fixture_rollouts
from benchmarks.harness import ROOT, parser, write_json
from ftis_edge.common.ports import free_port
from ftis_edge.rollout import wire
from ftis_edge.peers.swarm import SwarmClient
from relay import protocol as P
from relay.cli import query_stats


def payloads_for(node: str, n: int) -> list[bytes]:
    """n distinct messages from `node`: real groups, fresh rollout ids patched in the prefix."""
    base = []
    for r in fixture_rollouts():
        r.node_id = node
        base.append(wire.encode(r))
    out = []
    for i in range(n):
        msg = bytearray(base[i % len(base)])
        off = wire.peek(bytes(msg)).payload_offset - 4 - 16     # the 16 raw bytes of a hex id
        msg[off:off + 16] = os.urandom(16)
        out.append(bytes(msg))
    return out


def summarize(name: str, n_msgs: int, nbytes: int, dt: float, lat: list[float]) -> dict:
    lat_ms = np.array(lat) * 1e3
    return {"system": name, "delivered": n_msgs, "seconds": dt, "rollouts_s": n_msgs / dt,
            "mb_s": nbytes / dt / 1e6, "p50_ms": float(np.percentile(lat_ms, 50)),
            "p99_ms": float(np.percentile(lat_ms, 99))}


# ------------------------------------------------------------------ client processes
# Every client is its own process, as nodes are: one Python process holding 16 clients
# would measure the GIL, not the relay.

def _relay_publisher(addr, node, n, pace_s, go, out):
    msgs = payloads_for(node, n)
    c = SwarmClient(addr, swarm="bench", node_id=node, subscribe=False).start()
    while not c.stats()["connected"]:
        time.sleep(0.01)
    go.wait()
    cpu0 = time.process_time()
    sent = {}
    for m in msgs:
        sent[wire.peek(m).rollout_id] = time.time()
        c.publish_bytes(m)
        c.wait_pending(200)               # the node-side window: acked flow control
        if pace_s:
            time.sleep(pace_s)
    c.wait_pending(0)
    c.close()
    out.put(("sent", sent, time.process_time() - cpu0))


def _relay_subscriber(addr, node, expected, timeout_s, ready, go, out):
    c = SwarmClient(addr, swarm="bench", node_id=node, decode=False).start()
    while not c.stats()["connected"]:
        time.sleep(0.01)
    time.sleep(0.2)                           # let the SUB land
    ready.put(node)
    go.wait()
    cpu0 = time.process_time()
    got, nbytes = [], 0
    end = time.time() + timeout_s
    while len(got) < expected and time.time() < end:
        for x in c.poll(timeout_s=0.05):
            got.append((x.rollout_id, x.received_at))
            nbytes += x.nbytes
    c.close()
    out.put(("recv", got, nbytes, time.process_time() - cpu0))


def _welcomed_dealer(ctx, addr: str, node: str, rcvhwm: int = 0):
    """A bare DEALER that said HELLO as NODE and was welcomed (set up before the timed part)."""
    d = ctx.socket(zmq.DEALER)
    if rcvhwm:
        d.setsockopt(zmq.RCVHWM, rcvhwm)
    d.connect(addr)
    d.send_multipart([P.HELLO, orjson.dumps({"node_id": node, "protocol": P.RELAY_PROTOCOL})])
    assert d.poll(10_000) and d.recv_multipart()[0] == P.WELCOME
    return d


def _raw_relay_publisher(addr, node, n, pace_s, go, out):
    """The relay protocol on a bare DEALER (no SwarmClient): the counterpart of a PUB socket."""
    msgs = payloads_for(node, n)
    ctx = zmq.Context()
    d = _welcomed_dealer(ctx, addr, node)
    go.wait()
    cpu0 = time.process_time()
    sent, acked, window = {}, 0, 200
    for i, m in enumerate(msgs):
        while i - acked >= window:          # the same acked flow control as SwarmClient
            if d.poll(1000):
                acked += d.recv_multipart()[0] == P.ACK
        sent[wire.peek(m).rollout_id] = time.time()
        d.send_multipart([P.PUB, b"bench", m])
        if pace_s:
            time.sleep(pace_s)
    while acked < n and d.poll(5000):
        acked += d.recv_multipart()[0] == P.ACK
    d.close(0)
    ctx.term()
    out.put(("sent", sent, time.process_time() - cpu0))


def _raw_relay_subscriber(addr, node, expected, timeout_s, ready, go, out):
    ctx = zmq.Context()
    d = _welcomed_dealer(ctx, addr, node, rcvhwm=100_000)
    d.send_multipart([P.SUB, b"bench", orjson.dumps({"epoch": None, "last_seq": 0})])
    ready.put(node)
    go.wait()
    cpu0 = time.process_time()
    got, nbytes = [], 0
    end = time.time() + timeout_s
    next_ping, mark = 0.0, ""
    while len(got) < expected and time.time() < end:
        if time.time() >= next_ping:           # the newest MARK read: the relay bounds its queued bytes by it
            next_ping = time.time() + 0.5
            d.send_multipart([P.PING, orjson.dumps({"t": 0, "mark": mark})])
        if d.poll(50):
            while True:
                try:
                    f = d.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if f[0] == P.DELIVER:
                    _, _, _, _, rid, _, payload = P.unpack_deliver(f[1])
                    got.append((rid.decode(), time.time()))
                    nbytes += len(payload)
                elif f[0] == P.MARK and f[1]:
                    mark = f[1].hex()
    d.close(0)
    ctx.term()
    out.put(("recv", got, nbytes, time.process_time() - cpu0))


def _proxy_publisher(front, node, n, pace_s, go, out):
    msgs = payloads_for(node, n)
    ctx = zmq.Context()
    p = ctx.socket(zmq.PUB)
    p.setsockopt(zmq.SNDHWM, 100_000)
    p.connect(front)
    time.sleep(1.0)                           # slow joiner: subscriptions must arrive first
    go.wait()
    cpu0 = time.process_time()
    sent = {}
    for m in msgs:
        sent[wire.peek(m).rollout_id] = time.time()
        p.send_multipart([b"bench", m])
        if pace_s:
            time.sleep(pace_s)
    time.sleep(0.2)
    p.close(linger=2000)
    ctx.term()
    out.put(("sent", sent, time.process_time() - cpu0))


def _proxy_subscriber(back, node, expected, timeout_s, ready, go, out):
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, 100_000)
    s.connect(back)
    s.setsockopt(zmq.SUBSCRIBE, b"bench")
    ready.put(node)
    go.wait()
    cpu0 = time.process_time()
    got, nbytes = [], 0
    end = time.time() + timeout_s
    while len(got) < expected and time.time() < end:
        if s.poll(50):
            while True:
                try:
                    _, m = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got.append((wire.peek(m).rollout_id, time.time()))
                nbytes += len(m)
    s.close(0)
    ctx.term()
    out.put(("recv", got, nbytes, time.process_time() - cpu0))


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_clients(name, pub_target, sub_target, endpoint_pub, endpoint_sub, pubs, subs, per_pub,
                 timeout_s, pace_s, hub_pid) -> dict:
    mpc = mp.get_context("spawn")
    go, ready, out = mpc.Event(), mpc.Queue(), mpc.Queue()
    expected = pubs * per_pub
    procs = [mpc.Process(target=sub_target, args=(endpoint_sub, f"sub{i}", expected, timeout_s, ready, go, out))
             for i in range(subs)]
    procs += [mpc.Process(target=pub_target, args=(endpoint_pub, f"pub{i}", per_pub, pace_s, go, out))
              for i in range(pubs)]
    for p in procs:
        p.start()
    for _ in range(subs):
        ready.get(timeout=60)
    time.sleep(1.5)                           # publishers connected and (proxy) subscriptions spread
    t0 = time.time()
    go.set()
    sent, recvs, cpu = {}, [], {"pub": 0.0, "sub": 0.0}
    hub0 = _proc_cpu_s(hub_pid)
    for _ in range(pubs + subs):
        item = out.get(timeout=timeout_s + 30)
        if item[0] == "sent":
            sent.update(item[1])
            cpu["pub"] += item[2]
        else:
            recvs.append(item)
            cpu["sub"] += item[3]
    cpu["hub"] = _proc_cpu_s(hub_pid) - hub0
    t_last = max((t for r in recvs for _, t in r[1]), default=t0)
    for p in procs:
        p.join(10)
    lat = [t - sent[rid] for r in recvs for rid, t in r[1] if rid in sent]
    n = sum(len(r[1]) for r in recvs)
    return summarize(name, n, sum(r[2] for r in recvs), t_last - t0, lat) | {
        "complete": all(len(r[1]) == expected for r in recvs),
        # CPU per delivery from the go signal to the end, by role: what a shared machine's
        # throughput depends on (the relay or proxy process is the "hub")
        **{f"cpu_{k}_us": v / max(1, n) * 1e6 for k, v in cpu.items()}}


def bench_relay(pubs: int, subs: int, per_pub: int, timeout_s: float, pace_s: float = 0.0,
                raw_clients: bool = False) -> dict:
    addr = f"tcp://127.0.0.1:{free_port()}"
    # no rate limits and no global accept budget: the proxy it is compared with has none
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", addr, "--rate", "0", "--rate-mb", "0",
                             "--accept-rate", "0", "--replay", "100000", "--replay-mb", "2048",
                             "--log-level", "WARNING"], cwd=ROOT)
    try:
        deadline = time.time() + 10
        while True:
            try:
                query_stats(addr, timeout_s=0.5)
                break
            except TimeoutError:
                if time.time() > deadline:
                    raise
        if raw_clients:
            return _run_clients("ftis-relay", _raw_relay_publisher, _raw_relay_subscriber, addr, addr,
                                pubs, subs, per_pub, timeout_s, pace_s, proc.pid)
        return _run_clients("ftis-relay+SwarmClient", _relay_publisher, _relay_subscriber, addr, addr,
                            pubs, subs, per_pub, timeout_s, pace_s, proc.pid)
    finally:
        proc.terminate()
        proc.wait(5)


def _proxy(front: str, back: str) -> None:
    ctx = zmq.Context()
    xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    for s in (xsub, xpub):                # before bind: a listener copies its options
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.RCVHWM, 100_000)
    xsub.bind(front)
    xpub.bind(back)
    zmq.proxy(xsub, xpub)


def bench_proxy(pubs: int, subs: int, per_pub: int, timeout_s: float, pace_s: float = 0.0) -> dict:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    proc = mp.get_context("spawn").Process(target=_proxy, args=(front, back), daemon=True)
    proc.start()
    try:
        return _run_clients("raw XSUB/XPUB proxy", _proxy_publisher, _proxy_subscriber, front, back,
                            pubs, subs, per_pub, timeout_s, pace_s, proc.pid)
    finally:
        proc.terminate()
        proc.join(5)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--pubs", type=int, default=8)
    ap.add_argument("--subs", type=int, default=8)
    ap.add_argument("--per-pub", type=int, default=1500)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    rows = [bench_proxy(args.pubs, args.subs, args.per_pub, args.timeout),
            bench_relay(args.pubs, args.subs, args.per_pub, args.timeout, raw_clients=True),
            bench_relay(args.pubs, args.subs, args.per_pub, args.timeout)]
    paced = [bench_proxy(args.pubs, args.subs, 60, args.timeout, pace_s=0.02),
             bench_relay(args.pubs, args.subs, 60, args.timeout, pace_s=0.02, raw_clients=True),
             bench_relay(args.pubs, args.subs, 60, args.timeout, pace_s=0.02)]
    size = np.mean([len(m) for m in payloads_for("x", 5)])
    write_json(args.json, {"pubs": args.pubs, "subs": args.subs, "per_pub": args.per_pub, "payload_bytes": size,
                           "flat_out": rows, "paced_50_per_s": paced})
    print(f"{args.pubs} publishers x {args.subs} subscribers (each subscriber gets every rollout), "
          f"~{size / 1024:.1f} KB real encoded groups, loopback, {os.cpu_count()} CPUs")
    print(f"{'system':<24}{'load':<22}{'delivered':>10}{'s':>7}{'rollouts/s':>12}{'MB/s':>8}"
          f"{'p50 ms':>9}{'p99 ms':>9}{'all?':>6}  CPU us/delivery: pub  hub  sub")
    for load, group in ((f"flat out, {args.per_pub}/pub", rows), ("paced, 50/s per pub", paced)):
        for r in group:
            print(f"{r['system']:<24}{load:<22}{r['delivered']:>10}{r['seconds']:>7.2f}{r['rollouts_s']:>12.0f}"
                  f"{r['mb_s']:>8.1f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{str(r['complete']):>6}"
                  f"{r['cpu_pub_us']:>22.0f}{r['cpu_hub_us']:>5.0f}{r['cpu_sub_us']:>5.0f}")
    print(f"throughput vs raw proxy (flat out): ftis-relay {rows[1]['rollouts_s'] / rows[0]['rollouts_s']:.2f}x, "
          f"with SwarmClient nodes {rows[2]['rollouts_s'] / rows[0]['rollouts_s']:.2f}x")
    print("ftis-relay rows use bare DEALER clients speaking the relay protocol (HELLO, SUB, PUB with a "
          "200-ack window), the counterpart of the proxy's bare PUB/SUB sockets; the SwarmClient rows "
          "add the node-side client (background thread, dedup, stats).")


if __name__ == "__main__":
    main()
