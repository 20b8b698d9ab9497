"""Attack: an identity flood on an open relay (issue 13, hole 4).

N identities, each on its own connection (spread over several processes), say HELLO and
publish ~4 KB rollouts flat out, ignoring every NACK. Meanwhile a legitimate publisher sends a
rollout every 50 ms through the real client to a legitimate subscriber. The relay must keep
its promise: every rollout it ACKed to the legitimate publisher reaches the subscriber.

    python benchmarks/attack_flood.py [--identities 500] [--seconds 12] [--json]

Prints: flood sent / accepted (held = not accepted), legitimate rollouts ACKed / lost, and the
relay's peak memory (VmHWM) and refusals by reason.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import orjson  # noqa: E402
import zmq  # noqa: E402

from relay import protocol as P  # noqa: E402
from relay.cli import query_stats  # noqa: E402
from relay.client import RelayClient  # noqa: E402

BODY = os.urandom(4000)


def rollout(rid: str) -> bytes:
    """A message with a valid rollout prefix (codec none): all the relay ever reads."""
    r = rid.encode()
    return P.PREFIX_FIXED.pack(P.ROLLOUT_MAGIC, P.ROLLOUT_VERSION, 0, 0, len(r)) + r + \
        len(BODY).to_bytes(4, "little") + BODY


def _flooder(address: str, first: int, n: int, seconds: float, out: mp.Queue) -> None:
    ctx = zmq.Context()
    socks = []
    for i in range(first, first + n):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 200)
        s.connect(address)
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"sybil-{i}", "protocol": P.RELAY_PROTOCOL})])
        socks.append(s)
    sent = acked = 0
    deadline = time.time() + seconds
    k = 0
    while time.time() < deadline:
        for s in socks:
            try:
                s.send_multipart([P.PUB, b"swarm", rollout(f"f{first}-{k}")], zmq.NOBLOCK)
                sent += 1
                k += 1
            except zmq.Again:
                pass
            while True:
                try:
                    f = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                acked += f[0] == P.ACK
    for s in socks:
        s.close(0)
    ctx.term()
    out.put((sent, acked))


def _vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identities", type=int, default=500, help="flooding identities (one connection each)")
    ap.add_argument("--procs", type=int, default=4, help="processes the flood is spread over")
    ap.add_argument("--seconds", type=float, default=12.0, help="flood duration")
    ap.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = ap.parse_args(argv)

    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    relay = subprocess.Popen([sys.executable, "-m", "relay", "--bind", address, "--log-level", "WARNING"],
                             cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                query_stats(address, timeout_s=0.5)
                break
            except TimeoutError:
                pass
        pub = RelayClient(address, swarm="swarm", node_id="alice", subscribe=False).start()
        sub = RelayClient(address, swarm="swarm", node_id="bob").start()
        for _ in range(100):
            if pub.stats()["connected"] and sub.stats()["connected"]:
                break
            time.sleep(0.05)
        q: mp.Queue = mp.Queue()
        per = -(-args.identities // args.procs)
        flood = [mp.Process(target=_flooder, args=(address, i * per, min(per, args.identities - i * per),
                                                   args.seconds, q)) for i in range(args.procs)]
        for p in flood:
            p.start()
        published, received = [], set()
        t_end = time.time() + args.seconds
        while time.time() < t_end:
            rid = f"legit-{len(published)}"
            pub.publish_bytes(rollout(rid))
            published.append(rid)
            received.update(d.rollout_id for d in sub.poll())
            time.sleep(0.05)
        totals = [q.get(timeout=60) for _ in flood]
        for p in flood:
            p.join(10)
        deadline = time.time() + 30               # let the legitimate publisher finish its retries
        while time.time() < deadline and (pub.pending() or not set(published) <= received):
            received.update(d.rollout_id for d in sub.poll(timeout_s=0.2))
        received.update(d.rollout_id for d in sub.poll(timeout_s=0.5))
        acked = pub.stats()["acked"]
        pending = pub.pending()
        stats = query_stats(address)
        res = {
            "identities": args.identities, "seconds": args.seconds,
            "flood_sent": sum(t[0] for t in totals), "flood_accepted": sum(t[1] for t in totals),
            "legit_published": len(published), "legit_acked": acked, "legit_pending": pending,
            "legit_lost": len([r for r in published if r not in received]) - pending,
            "legit_nacked": pub.stats()["nacked"],
            "relay_vm_hwm_mb": round(_vm_hwm_mb(relay.pid), 1),
            "relay_rejected": stats["rejected"], "relay_skipped": stats["counts"].get("skipped_slow", 0),
        }
        pub.close()
        sub.close()
    finally:
        relay.terminate()
        relay.wait(10)
    held = 1 - res["flood_accepted"] / max(1, res["flood_sent"])
    print(f"identity flood: {res['identities']} identities x {res['seconds']:.0f} s on one open relay")
    print(f"flood: {res['flood_sent']} sent, {res['flood_accepted']} accepted ({held:.1%} held back)")
    print(f"legitimate pair: {res['legit_published']} published, {res['legit_acked']} ACKed, "
          f"{res['legit_lost']} ACKed but lost, nacks {res['legit_nacked']}")
    print(f"relay: peak RSS {res['relay_vm_hwm_mb']} MB, rejected {res['relay_rejected']}, "
          f"skipped {res['relay_skipped']}")
    if args.json:
        print(orjson.dumps(res).decode())
    return 0 if res["legit_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
