"""Attack: many subscriber connections that fill their queue and then say BYE, go silent, or
stay live without reading, against the relay's memory and an honest pair's throughput (a real
relay process with its default caps, real ZeroMQ sockets; issue 51.2).

Each scenario runs on a fresh relay: an honest publisher (the real client, 256 KB rollouts, at
most 8 unACKed) and an honest reader (the real client) run for --seconds; after --warm s,
--conns attacker connections arrive over --spread s, each HELLO + SUB from the start of the
replay buffer (so its queue fills at once) and never read (RCVHWM 1):

  control  no attackers
  bye      each says BYE 1 s after its SUB and keeps its connection open
  silent   each sends nothing more (the relay times it out) and keeps its connection open
  live     each PINGs every second, claiming nothing, and never reads

Reported: the relay's peak RSS (VmHWM) and peak / final queued bytes (its STATS, every
second), the ghosts at the end, rollouts the publisher got ACKed and the reader received.
The relay is killed (and the row says so) if its RSS passes --rss-limit-mb.

    python -m benchmarks.attacks.relay_ghosts [--conns 200] [--seconds 30] [--relay-root DIR] [--json PATH]

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

MB = 1 << 20
BEHAVIOURS = ("control", "bye", "silent", "live")


def _crowd(address: str, n: int, behaviour: str, spread_s: float, seconds: float) -> None:
    """n non-reading subscriber connections arriving over spread_s, each doing `behaviour`."""
    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, n + 64)
    socks, born, said_bye = [], [], set()
    t0 = time.time()
    next_ping = t0
    while time.time() - t0 < seconds:
        now = time.time()
        while len(socks) < n and len(socks) <= (now - t0) / spread_s * n:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 1)
            s.connect(address)
            s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"{behaviour}-{len(socks)}",
                                                      "protocol": P.RELAY_PROTOCOL})])
            s.send_multipart([P.SUB, b"swarm", orjson.dumps({"epoch": None, "last_seq": 0})])
            socks.append(s)
            born.append(now)
        if behaviour == "bye":
            for i, s in enumerate(socks):
                if i not in said_bye and now - born[i] >= 1.0:
                    s.send_multipart([P.BYE])
                    said_bye.add(i)
        elif behaviour == "live" and now >= next_ping:
            next_ping = now + 1.0
            for s in socks:
                try:
                    s.send_multipart([P.PING, orjson.dumps({"t": 0})], zmq.NOBLOCK)
                except zmq.Again:
                    pass
        time.sleep(0.02)
    for s in socks:
        s.close(0)
    ctx.term()


def run(behaviour: str, a, root: Path) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = start_relay(root, address)
    crowd = None
    pub = reader = None
    row = {"scenario": behaviour, "conns": 0 if behaviour == "control" else a.conns}
    try:
        time.sleep(1.0)
        pub = RelayClient(address, swarm="swarm", node_id="honest-pub", subscribe=False).start()
        reader = RelayClient(address, swarm="swarm", node_id="honest-reader").start()
        body = os.urandom(256 << 10)
        t0 = time.time()
        next_stats, peak_q, last, rejected, received, published = t0, 0, {}, {}, 0, 0
        killed = False
        while time.time() - t0 < a.seconds:
            if crowd is None and behaviour != "control" and time.time() - t0 >= a.warm:
                crowd = mp.Process(target=_crowd, args=(address, a.conns, behaviour, a.spread,
                                                        a.seconds - a.warm + 5))
                crowd.start()
            while pub.pending() < 8:
                pub.publish_bytes(P.pack_prefix("none", f"r-{published}", "", "", len(body)) + body)
                published += 1
            received += len(reader.poll(timeout_s=0.02))
            if time.time() >= next_stats:
                next_stats += 1.0
                try:
                    st = query_stats(address, timeout_s=2.0)
                    last, rejected = st["queued"], st["rejected"]
                    peak_q = max(peak_q, last["bytes"])
                except TimeoutError:
                    pass
                if vm_bytes(relay.pid, "VmRSS") > a.rss_limit_mb * MB:
                    killed = True
                    break
        row.update(relay_rss_peak_mb=round(vm_bytes(relay.pid) / MB, 1), queued_peak_mb=round(peak_q / MB, 1),
                   queued_end_mb=round(last.get("bytes", 0) / MB, 1), ghosts_end=last.get("ghosts"),
                   published_acked=pub.stats()["acked"], reader_received=received, relay_rejected=rejected,
                   killed_at_rss_limit=killed)
        return row
    finally:
        for c in (pub, reader):
            if c is not None:
                c.close()
        stop(relay, crowd)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--conns", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warm", type=float, default=4.0)
    ap.add_argument("--spread", type=float, default=10.0, help="the attackers arrive over this many seconds")
    ap.add_argument("--rss-limit-mb", type=float, default=3000.0)
    ap.add_argument("--only", nargs="*", choices=BEHAVIOURS)
    ap.add_argument("--relay-root", default=str(ROOT))
    a = ap.parse_args()
    root = Path(a.relay_root).resolve()
    rows = []
    for b in a.only or BEHAVIOURS:
        rows.append(run(b, a, root))
        write_json(a.json, {"relay_root": str(root), "seconds": a.seconds, "conns": a.conns, "rows": rows})
    print(f"relay code: {root}; {a.seconds:.0f} s, attackers from {a.warm:.0f} s over {a.spread:.0f} s")
    print(f"{'scenario':<9}{'conns':>6}{'RSS peak MB':>12}{'queued peak':>12}{'queued end':>11}{'ghosts':>7}"
          f"{'pub ACKed':>10}{'reader got':>11}")
    for r in rows:
        print(f"{r['scenario']:<9}{r['conns']:>6}{r['relay_rss_peak_mb']:>12}{r['queued_peak_mb']:>12}"
              f"{r['queued_end_mb']:>11}{r['ghosts_end']!s:>7}{r['published_acked']:>10}{r['reader_received']:>11}"
              + ("  (killed at the RSS limit)" if r["killed_at_rss_limit"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
