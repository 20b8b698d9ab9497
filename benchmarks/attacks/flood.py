"""Attacks on the relay's budgets: an identity flood (issue 13, hole 4) and a flood of the
global accept budget (issue 29.2).

identity (default): N identities, each on its own connection (spread over several processes),
say HELLO and publish ~4 KB rollouts flat out, ignoring every NACK. Meanwhile a legitimate
publisher sends a rollout every 50 ms through the real client to a legitimate subscriber. The
relay must keep its promise: every rollout it ACKed to the legitimate publisher reaches the
subscriber.

    python -m benchmarks.attacks.flood [--identities 500] [--seconds 12] [--json PATH]

Prints: flood sent / accepted (held = not accepted), legitimate rollouts ACKed / lost, and the
relay's peak memory (VmHWM) and refusals by reason.

accept-budget: F flooding identities publish at --flood-rate rollouts/s each, ignoring every
NACK, against a relay whose global accept budget (--accept-rate) they exceed together; an
honest publisher (the real client) publishes a node's round, --round groups at once, every
--period s, to an everything-subscriber. Overload must be shed from the flooders: the honest
publisher is never `busy`, loses nothing, and its p99 publish-to-delivery stays <= 1 s.

    python -m benchmarks.attacks.flood --scenario accept-budget [--flooders 2 --flood-rate 100
        --accept-rate 50 --round 4 --period 2 --seconds 12] [--json PATH]

sybil-budget (issue 25.2): --sybils fake identities publish --sybil-rate rollouts/s each, tagged
with the subscribers' task, on an open relay, while an honest publisher (the real client) sends
--honest-rate/s. Two budgeted subscribers (K = --k per --window s) side by side: one told the
relay the honest publisher was useful (USEFUL, as a node does after training on its groups),
one never did. The honest publisher must get >= 90% of its fair share from the first: all it
publishes, since --honest-rate x --window <= K - probation (K // 8).

    python -m benchmarks.attacks.flood --scenario sybil-budget [--sybils 40 --sybil-rate 5 --k 8
        --window 2 --honest-rate 2 --seconds 10] [--json PATH]
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import orjson
import zmq

from benchmarks.harness import ROOT, parser, vm_bytes, write_json
from ftis_edge.common.ports import free_port
from relay import protocol as P
from relay.cli import query_stats
from relay.client import RelayClient

BODY = os.urandom(4000)


def rollout(rid: str, task: str = "") -> bytes:
    """A message with a valid rollout prefix (codec none): all the relay ever reads."""
    return P.pack_prefix("none", rid, task, "", len(BODY)) + BODY


def hello_crowd(ctx, address: str, ids: range, prefix: str = "sybil", sndhwm: int = 0) -> list:
    """One DEALER per identity PREFIX-i, each connected and past HELLO (replies are not awaited)."""
    socks = []
    for i in ids:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if sndhwm:
            s.setsockopt(zmq.SNDHWM, sndhwm)
        s.connect(address)
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": f"{prefix}-{i}", "protocol": P.RELAY_PROTOCOL})])
        socks.append(s)
    return socks


def _flooder(address: str, first: int, n: int, seconds: float, out: mp.Queue) -> None:
    ctx = zmq.Context()
    socks = hello_crowd(ctx, address, range(first, first + n), sndhwm=200)
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


def _paced_flooder(address: str, name: str, rate: float, seconds: float, out: mp.Queue) -> None:
    """One identity publishing at `rate` rollouts/s, whatever the relay answers."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})])
    sent = acked = 0
    t0 = time.time()
    while time.time() - t0 < seconds:
        while sent < (time.time() - t0) * rate:
            try:
                s.send_multipart([P.PUB, b"swarm", rollout(f"{name}-{sent}")], zmq.NOBLOCK)
            except zmq.Again:
                pass
            sent += 1
        while s.poll(0):
            acked += s.recv_multipart()[0] == P.ACK
        time.sleep(0.002)
    s.close(0)
    ctx.term()
    out.put((sent, acked))


def _sybil_crowd(address: str, n: int, rate: float, delay_s: float, seconds: float, out: mp.Queue) -> None:
    """n identities, one connection each, each publishing `rate` gsm8k-tagged rollouts/s."""
    ctx = zmq.Context()
    socks = hello_crowd(ctx, address, range(n))
    time.sleep(delay_s)
    sent = acked = 0
    t0 = time.time()
    while time.time() - t0 < seconds:
        due = int((time.time() - t0) * rate) + 1
        for i, s in enumerate(socks):
            for j in range(sent // n, due):
                try:
                    s.send_multipart([P.PUB, b"swarm", rollout(f"sybil-{i}-{j}", "gsm8k")], zmq.NOBLOCK)
                except zmq.Again:
                    pass
            while s.poll(0):
                acked += s.recv_multipart()[0] == P.ACK
        sent = due * n
        time.sleep(0.01)
    for s in socks:
        s.close(0)
    ctx.term()
    out.put((sent, acked))


def sybil_budget(args) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = _start_relay(address)
    warm = 2.0 * args.window
    try:
        alice = RelayClient(address, swarm="swarm", node_id="alice", subscribe=False).start()
        subs = {name: RelayClient(address, swarm="swarm", node_id=name, budget_k=args.k,
                                  budget_window_s=args.window, filters={"task": ["gsm8k"]}).start()
                for name in ("marks", "plain")}
        _connected(alice, *subs.values())
        q: mp.Queue = mp.Queue()
        crowd = mp.Process(target=_sybil_crowd, args=(address, args.sybils, args.sybil_rate, warm, args.seconds, q))
        crowd.start()
        got = {name: [] for name in subs}
        published: list[str] = []
        t0 = time.time()
        marked = False
        while time.time() - t0 < warm + args.seconds:
            now = time.time() - t0
            while len(published) < now * args.honest_rate:
                rid = f"alice-{len(published)}"
                alice.publish_bytes(rollout(rid, "gsm8k"), task="gsm8k")
                published.append(rid)
            if not marked and now >= warm - 0.5:
                # what a node does after a round: the ids whose groups it trained on (alice's)
                subs["marks"].mark_useful({d.sender for d in got["marks"]})
                marked = True
            for name, c in subs.items():
                got[name] += [d for d in c.poll(timeout_s=0.005)]
        tail = time.time() + 1.0
        while time.time() < tail:
            for name, c in subs.items():
                got[name] += c.poll(timeout_s=0.05)
        sent, acked = q.get(timeout=60)
        crowd.join(10)
        measured = set(published[int(warm * args.honest_rate):])     # published once the crowd was on
        res = {"scenario": "sybil-budget", "sybils": args.sybils, "sybil_rate": args.sybil_rate, "k": args.k,
               "window_s": args.window, "honest_rate": args.honest_rate, "seconds": args.seconds,
               "sybil_sent": sent, "sybil_acked": acked, "honest_fair_share": len(measured)}
        for name, items in got.items():
            during = [d for d in items if d.sender != "alice" or d.rollout_id in measured]
            res[f"{name}_honest"] = sum(d.rollout_id in measured for d in during)
            res[f"{name}_sybil"] = sum(d.sender.startswith("sybil-") for d in during)
        res["marks_honest_share"] = round(res["marks_honest"] / max(1, len(measured)), 3)
        res["plain_honest_share"] = round(res["plain_honest"] / max(1, len(measured)), 3)
        for c in (alice, *subs.values()):
            c.close()
    finally:
        relay.terminate()
        relay.wait(10)
    return res


def _start_relay(address: str, *flags: str) -> subprocess.Popen:
    relay = subprocess.Popen([sys.executable, "-m", "relay", "--bind", address, "--log-level", "WARNING", *flags],
                             cwd=ROOT, stdout=subprocess.DEVNULL)
    for _ in range(100):
        try:
            query_stats(address, timeout_s=0.5)
            break
        except TimeoutError:
            pass
    return relay


def _connected(*clients) -> None:
    for _ in range(200):
        if all(c.stats()["connected"] for c in clients):
            return
        time.sleep(0.05)


def accept_budget_flood(args) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = _start_relay(address, "--accept-rate", str(args.accept_rate), "--accept-burst", str(args.accept_rate),
                         "--rate", "0", "--rate-mb", "0")
    try:
        pub = RelayClient(address, swarm="swarm", node_id="honest", subscribe=False).start()
        sub = RelayClient(address, swarm="swarm", node_id="everything").start()
        _connected(pub, sub)
        q: mp.Queue = mp.Queue()
        flood = [mp.Process(target=_paced_flooder, args=(address, f"flooder-{i}", args.flood_rate, args.seconds, q))
                 for i in range(args.flooders)]
        for p in flood:
            p.start()
        time.sleep(1.0)                           # the flood is on: the budget is spent
        published: dict[str, float] = {}
        arrived: dict[str, float] = {}
        t_end = time.time() + args.seconds - 2.0
        next_round = time.time()
        while time.time() < t_end or (pub.pending() and time.time() < t_end + 10):
            now = time.time()
            if now >= next_round and now < t_end:
                next_round += args.period
                for _ in range(args.round):      # a node's round: its groups at once
                    rid = f"honest-{len(published)}"
                    published[rid] = time.time()
                    pub.publish_bytes(rollout(rid))
            for d in sub.poll(timeout_s=0.01):
                if d.rollout_id in published:
                    arrived.setdefault(d.rollout_id, time.time())
        deadline = time.time() + 5
        while time.time() < deadline and set(published) - set(arrived):
            for d in sub.poll(timeout_s=0.1):
                arrived.setdefault(d.rollout_id, time.time())
        totals = [q.get(timeout=60) for _ in flood]
        for p in flood:
            p.join(10)
        lat = sorted(arrived[r] - published[r] for r in arrived if r in published)
        stats = query_stats(address)
        res = {
            "scenario": "accept-budget", "flooders": args.flooders, "flood_rate": args.flood_rate,
            "accept_rate": args.accept_rate, "round": args.round, "period": args.period,
            "flood_sent": sum(t[0] for t in totals), "flood_accepted": sum(t[1] for t in totals),
            "honest_published": len(published), "honest_acked": pub.stats()["acked"],
            "honest_lost": len(set(published) - set(arrived)), "honest_nacked": pub.stats()["nacked"],
            "p50_ms": round(1e3 * lat[len(lat) // 2], 1) if lat else None,
            "p99_ms": round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
            "max_ms": round(1e3 * lat[-1], 1) if lat else None,
            "relay_rejected": stats["rejected"],
        }
        pub.close()
        sub.close()
    finally:
        relay.terminate()
        relay.wait(10)
    return res


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--identities", type=int, default=500, help="flooding identities (one connection each)")
    ap.add_argument("--procs", type=int, default=4, help="processes the flood is spread over")
    ap.add_argument("--seconds", type=float, default=12.0, help="flood duration")
    ap.add_argument("--scenario", choices=("identity", "accept-budget", "sybil-budget"), default="identity")
    ap.add_argument("--sybils", type=int, default=40, help="sybil-budget: fake identities")
    ap.add_argument("--sybil-rate", type=float, default=5.0, help="sybil-budget: rollouts/s per fake identity")
    ap.add_argument("--k", type=int, default=8, help="sybil-budget: the subscribers' K per window")
    ap.add_argument("--window", type=float, default=2.0, help="sybil-budget: the subscribers' budget window, s")
    ap.add_argument("--honest-rate", type=float, default=2.0, help="sybil-budget: the honest publisher's rollouts/s")
    ap.add_argument("--flooders", type=int, default=2, help="accept-budget: flooding identities")
    ap.add_argument("--flood-rate", type=float, default=100.0, help="accept-budget: rollouts/s per flooder")
    ap.add_argument("--accept-rate", type=float, default=50.0, help="accept-budget: the relay's global budget")
    ap.add_argument("--round", type=int, default=4, help="accept-budget: groups the honest node publishes at once")
    ap.add_argument("--period", type=float, default=2.0, help="accept-budget: s between the honest node's rounds")
    args = ap.parse_args(argv)
    if args.scenario == "sybil-budget":
        if args.seconds == ap.get_default("seconds"):
            args.seconds = 10.0
        res = sybil_budget(args)
        return _report(res, args.json, res["marks_honest_share"] >= 0.9, [
            f"sybil budget: {res['sybils']} fake ids x {res['sybil_rate']:g} rollouts/s on an open relay; "
            f"subscribers K = {res['k']} per {res['window_s']:g} s; honest publisher {res['honest_rate']:g}/s",
            f"fake ids: {res['sybil_sent']} sent, {res['sybil_acked']} ACKed",
            f"honest publisher's fair share: {res['honest_fair_share']} rollouts (all it published during the attack)",
            f"subscriber that marked it useful: honest {res['marks_honest']} ({res['marks_honest_share']:.0%}), "
            f"fake {res['marks_sybil']}",
            f"subscriber that marked nobody:    honest {res['plain_honest']} ({res['plain_honest_share']:.0%}), "
            f"fake {res['plain_sybil']}"])
    if args.scenario == "accept-budget":
        res = accept_budget_flood(args)
        print(f"accept-budget flood: {res['flooders']} flooders x {res['flood_rate']:g} rollouts/s against a global "
              f"budget of {res['accept_rate']:g}/s; honest node: {res['round']} groups every {res['period']:g} s")
        print(f"flood: {res['flood_sent']} sent, {res['flood_accepted']} accepted")
        print(f"honest: {res['honest_published']} published, {res['honest_acked']} ACKed, {res['honest_lost']} lost, "
              f"nacks {res['honest_nacked']}; publish-to-delivery p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, "
              f"max {res['max_ms']} ms")
        print(f"relay: rejected {res['relay_rejected']}")
        write_json(args.json, res)
        ok = res["honest_lost"] == 0 and res["p99_ms"] is not None and res["p99_ms"] <= 1000
        return 0 if ok else 1

    address = f"tcp://127.0.0.1:{free_port()}"
    relay = _start_relay(address)
    try:
        pub = RelayClient(address, swarm="swarm", node_id="alice", subscribe=False).start()
        sub = RelayClient(address, swarm="swarm", node_id="bob").start()
        _connected(pub, sub)
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
            "relay_vm_hwm_mb": round(vm_bytes(relay.pid) / 2**20, 1),
            "relay_rejected": stats["rejected"], "relay_skipped": stats["counts"].get("skipped_slow", 0),
        }
        pub.close()
        sub.close()
    finally:
        relay.terminate()
        relay.wait(10)
    held = 1 - res["flood_accepted"] / max(1, res["flood_sent"])
    return _report(res, args.json, res["legit_lost"] == 0, [
        f"identity flood: {res['identities']} identities x {res['seconds']:.0f} s on one open relay",
        f"flood: {res['flood_sent']} sent, {res['flood_accepted']} accepted ({held:.1%} held back)",
        f"legitimate pair: {res['legit_published']} published, {res['legit_acked']} ACKed, "
        f"{res['legit_lost']} ACKed but lost, nacks {res['legit_nacked']}",
        f"relay: peak RSS {res['relay_vm_hwm_mb']} MB, rejected {res['relay_rejected']}, "
        f"skipped {res['relay_skipped']}"])


def _report(res: dict, json_path, ok: bool, lines: list[str]) -> int:
    """Print a scenario's lines (and write its result where --json says); the exit code says ok."""
    print("\n".join(lines))
    write_json(json_path, res)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
