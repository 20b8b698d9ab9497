"""Attack: connections that ask and never read, against the relay's memory and every kind of
honest request (a real relay process with its default caps, real ZeroMQ sockets; issue 62.1).

Each row runs on a fresh relay for --seconds. Honest traffic throughout:

  publisher  the real client, 4 KB rollouts at --pub-rate/s: PUB -> ACK
  reader     the real client, subscribed to everything: DELIVER
  prober     once a second a fresh connection (as a new node or `ftis-relay status` is) says
             HELLO, SUB, PING, STATS and reads: WELCOME, SUBOK, PONG, STATS within 3 s

After --warm s, --conns attacker connections arrive over --spread s: each says HELLO and SUB
to the most topics it may (long names, nobody publishes on them: no rollout is ever queued
for it; with its long node id its entry in every STATS reply is ~1 KB), then asks STATS at the
allowed 2/s and PINGs at 4/s, and never reads (RCVHWM 1); every 2 s it says HELLO and SUB
again (a connection the relay cut comes back as a new one).

Reported: the relay's peak RSS (VmHWM), peak queued bytes and connections shed over their cap
(its STATS), and for each honest request type the share answered. The relay is killed (the row says so) past --rss-limit-mb.

    python -m benchmarks.attacks.relay_replies [--conns 100 300] [--seconds 30] [--relay-root DIR] [--json PATH]

--relay-root runs another checkout's relay and client (e.g. the code before a change,
extracted with ``git archive REV relay | tar -x -C DIR``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, start_relay, stop, vm_bytes, write_json
from ftis_edge.common.ports import free_port

if "--relay-root" in sys.argv:     # another checkout's relay AND client: its package must win the import
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--relay-root") + 1]).resolve()))

import orjson  # noqa: E402
import zmq  # noqa: E402

from relay import protocol as P  # noqa: E402
from relay.cli import query_stats  # noqa: E402
from relay.client import RelayClient  # noqa: E402
from testkit.askers import KINDS, join, probe  # noqa: E402

MB = 1 << 20


def _askers(address: str, n: int, spread_s: float, seconds: float) -> None:
    """n connections arriving over spread_s: HELLO, SUB, then STATS 2/s and PING 4/s, never reading."""
    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, n + 64)
    socks = []
    t0 = time.time()
    next_ask, k = t0, 0
    while time.time() - t0 < seconds:
        now = time.time()
        while len(socks) < n and len(socks) <= (now - t0) / spread_s * n:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)     # the kernel holds little for it either
            s.connect(address)
            join(s, len(socks))
            socks.append(s)
        if now >= next_ask:
            next_ask += 0.25
            k += 1
            for i, s in enumerate(socks):
                try:
                    if k % 8 == 0:              # again every 2 s: a connection the relay cut comes back
                        join(s, i)
                    s.send_multipart([P.PING, orjson.dumps({"t": 0})], zmq.NOBLOCK)
                    if k % 2 == 0:
                        s.send_multipart([P.STATS], zmq.NOBLOCK)
                except zmq.Again:
                    pass
        time.sleep(0.01)
    for s in socks:
        s.close(0)
    ctx.term()


def run(conns: int, a, root: Path) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = start_relay(root, address)
    crowd = pub = reader = None
    ctx = zmq.Context()
    row = {"conns": conns}
    try:
        time.sleep(1.0)
        pub = RelayClient(address, swarm="swarm", node_id="honest-pub", subscribe=False).start()
        reader = RelayClient(address, swarm="swarm", node_id="honest-reader").start()
        body = os.urandom(4 << 10)
        t0 = time.time()
        next_pub, next_probe, peak_q, received, published = t0 + 1.0, t0 + 1.0, 0, 0, 0
        probes, answered, counts = 0, dict.fromkeys(KINDS, 0), {}
        killed = False
        while time.time() - t0 < a.seconds:
            now = time.time()
            if crowd is None and conns and now - t0 >= a.warm:
                crowd = mp.Process(target=_askers, args=(address, conns, a.spread, a.seconds - a.warm + 5))
                crowd.start()
            while now >= next_pub:
                next_pub += 1.0 / a.pub_rate
                pub.publish_bytes(P.pack_prefix("none", f"r-{published}", "", "", len(body)) + body)
                published += 1
            received += len(reader.poll(timeout_s=0.01))
            if now >= next_probe and now - t0 < a.seconds - 3:
                next_probe += 1.0
                probes += 1
                for k in probe(ctx, address):
                    answered[k] += 1
                try:
                    st = query_stats(address, timeout_s=0.5)
                    peak_q, counts = max(peak_q, st["queued"]["bytes"]), st["counts"]
                except TimeoutError:
                    pass
            if vm_bytes(relay.pid, "VmRSS") > a.rss_limit_mb * MB:
                killed = True
                break
        end = time.time() + 3.0              # the last rollouts' ACKs and deliveries
        while time.time() < end and (pub.pending() or received < published):
            received += len(reader.poll(timeout_s=0.05))
        acked = pub.stats()["acked"]
        row.update(relay_rss_peak_mb=round(vm_bytes(relay.pid) / MB, 1), queued_peak_mb=round(peak_q / MB, 1),
                   published=published, acked=acked, reader_received=received, probes=probes,
                   answered=answered, killed_at_rss_limit=killed,
                   relay_shed=counts.get("shed", 0), relay_cut=counts.get("cut", 0),
                   delivered_share={"ACK": round(acked / max(1, published), 3),
                                    "DELIVER": round(received / max(1, published), 3),
                                    **{k: round(v / max(1, probes), 3) for k, v in answered.items()}})
        return row
    finally:
        for c in (pub, reader):
            if c is not None:
                c.close()
        ctx.term()
        stop(relay, crowd)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--conns", type=int, nargs="+", default=[0, 100, 300])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warm", type=float, default=3.0)
    ap.add_argument("--spread", type=float, default=5.0, help="the attackers arrive over this many seconds")
    ap.add_argument("--pub-rate", type=float, default=10.0, help="honest rollouts per second")
    ap.add_argument("--rss-limit-mb", type=float, default=3000.0)
    ap.add_argument("--relay-root", default=str(ROOT))
    a = ap.parse_args()
    root = Path(a.relay_root).resolve()
    rows = []
    for n in a.conns:
        rows.append(run(n, a, root))
        write_json(a.json, {"relay_root": str(root), "seconds": a.seconds, "rows": rows})
    print(f"relay code: {root}; {a.seconds:.0f} s, askers from {a.warm:.0f} s over {a.spread:.0f} s")
    print(f"{'conns':>6}{'RSS peak MB':>12}{'queued peak MB':>15}{'shed':>6}   share answered: "
          + " ".join(f"{k:>8}" for k in ("ACK", "DELIVER") + KINDS))
    for r in rows:
        print(f"{r['conns']:>6}{r['relay_rss_peak_mb']:>12}{r['queued_peak_mb']:>15}{r['relay_shed']:>6}   {'':16}"
              + " ".join(f"{r['delivered_share'][k]:>8.2f}" for k in ("ACK", "DELIVER") + KINDS)
              + ("  (killed at the RSS limit)" if r["killed_at_rss_limit"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
