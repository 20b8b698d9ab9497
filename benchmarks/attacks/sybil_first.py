"""Attack: fake ids that came first keep a new honest publisher out of a budgeted subscriber.

Fake ids (one connection each) publish rollouts tagged like honest work from the start; after
--warm s an honest publisher (the real client) arrives and publishes --honest-rate rollouts/s.
A budgeted subscriber (the real client, K = --k per --window s) acts as a node does: after each
step (one a window) it names as useful (RelayClient.mark_useful) the publishers whose rollouts
it got that step carried a learning signal. Here the signal is known from the rollout id
(honest-*, fake-good-*: a signal; fake-junk-*: zero-reward junk, which intake accepts).

Scenarios (side by side in one run, each on a fresh relay):
  control            no fake ids
  fakes-N            N fake ids publishing junk from another address (--fakes)
  fakes-N-same-addr  the same from the honest publisher's own address (no source to tell apart)
  earned-N           N fake ids publish valid groups (and are named useful) until the honest
                     one arrives, junk from then on (the worst moment)
  churn              --churn-ids fake ids at a time, replaced by fresh ids every window
  churn-same-addr    the same from the honest publisher's address (a documented limit)
  crowd-N-before / -with / -after   N fake ids (--crowd) that start --warm s before the honest
                     publisher, at the same moment, or --warm s after it (issue 51.5)
  guarded-churn-N    an anchor publisher with a signal (named useful) from the start, and N fresh
                     ids a window: the subscriber is guarded when the honest one arrives

--runs R repeats every scenario R times (each on a fresh relay).

Fair share (docs/relay.md, "Delivery budgets"): judged against the publishers whose groups
carry a signal, here the honest one alone: K per window, at most what it published. Reported
per window of the honest publisher's life (rollouts counted in the window they were published):
share in the first 5 and 10 windows, steady state (windows 10 to the end), the first window it
got anything, and the first window w from which windows w..w+2 together reach 90 %.

    python -m benchmarks.attacks.sybil_first [--fakes 8 40 200] [--seconds 40] [--only NAME ...] [--runs 1]
                                             [--relay-root DIR] [--json PATH]

--relay-root runs another checkout's relay and client (e.g. the code before a change,
extracted with ``git archive REV relay | tar -x -C DIR``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, parser, start_relay, stop, write_json
from ftis_edge.common.ports import free_port

if "--relay-root" in sys.argv:     # another checkout's relay AND client: its package must win the import
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--relay-root") + 1]).resolve()))

import orjson  # noqa: E402
import zmq  # noqa: E402

from relay import protocol as P  # noqa: E402
from relay.client import RelayClient  # noqa: E402

ATTACKER_ADDRESS = "127.0.0.2"     # another loopback address: the relay sees another source


def rollout(rid: str, task: str = "gsm8k", size: int = 2000) -> bytes:
    body = os.urandom(size)
    return P.pack_prefix("none", rid, task, "", len(body)) + body


def _connect(ctx, address: str, node_id: str, source: str | None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    host_port = address.removeprefix("tcp://")
    s.connect(f"tcp://{source}:0;{host_port}" if source else address)
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": node_id, "protocol": P.RELAY_PROTOCOL})])
    return s


def _crowd(address: str, n: int, rate: float, seconds: float, source: str | None,
           good_s: float, churn_s: float) -> None:
    """n fake ids publishing `rate` rollouts/s each: valid groups for good_s s, junk after;
    every churn_s s (0: never) all of them are replaced by fresh ids."""
    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, n + 64)
    gen = 0
    socks = [_connect(ctx, address, f"fake-{gen}-{i}", source) for i in range(n)]
    t0 = tgen = time.time()
    sent = 0
    while time.time() - t0 < seconds:
        if churn_s and time.time() - tgen >= churn_s:
            for s in socks:
                s.close(0)
            gen, tgen = gen + 1, time.time()
            socks = [_connect(ctx, address, f"fake-{gen}-{i}", source) for i in range(n)]
        due = int((time.time() - t0) * rate) + 1
        kind = "good" if time.time() - t0 < good_s else "junk"
        while sent < due:
            for i, s in enumerate(socks):
                try:
                    s.send_multipart([P.PUB, b"swarm", rollout(f"fake-{kind}-{gen}-{i}-{sent}")], zmq.NOBLOCK)
                except zmq.Again:
                    pass
            sent += 1
        for s in socks:
            while s.poll(0):
                s.recv_multipart()
        time.sleep(0.02)
    for s in socks:
        s.close(0)
    ctx.term()


SCENARIOS = {   # name: (fake ids, their address, valid groups until the honest one arrives, churn,
    #                   when the crowd starts relative to the honest publisher (None: --warm s before),
    #                   an anchor publisher named useful from the start)
    "control": (0, ATTACKER_ADDRESS, False, False, None, False),
}


def scenarios(a) -> dict:
    out = dict(SCENARIOS)
    for n in a.fakes:
        out[f"fakes-{n}"] = (n, ATTACKER_ADDRESS, False, False, None, False)
    out[f"fakes-{max(a.fakes)}-same-addr"] = (max(a.fakes), None, False, False, None, False)
    out[f"earned-{a.earned}"] = (a.earned, ATTACKER_ADDRESS, True, False, None, False)
    out["churn"] = (a.churn_ids, ATTACKER_ADDRESS, False, True, None, False)
    out["churn-same-addr"] = (a.churn_ids, None, False, True, None, False)
    for order, lead in (("before", -a.warm), ("with", 0.0), ("after", a.warm)):
        out[f"crowd-{a.crowd}-{order}"] = (a.crowd, ATTACKER_ADDRESS, False, False, lead, False)
    out[f"guarded-churn-{a.crowd}"] = (a.crowd, ATTACKER_ADDRESS, False, True, None, True)
    return out


def _shares(got_idx: set, published: int, a) -> dict:
    per_window = int(round(a.honest_rate * a.window))
    n_windows = published // per_window
    fair = min(per_window, a.k)            # the only publisher with a signal: K, at most what it published
    share = [min(1.0, sum(i in got_idx for i in range(w * per_window, (w + 1) * per_window)) / fair)
             for w in range(n_windows)]

    def mean(xs):
        return round(sum(xs) / len(xs), 3) if xs else None

    first = next((w for w, s in enumerate(share) if s > 0), None)
    to_90 = next((w for w in range(len(share) - 2) if sum(share[w:w + 3]) / 3 >= 0.9), None)
    return {"windows": n_windows, "fair_per_window": fair, "first5": mean(share[:5]), "first10": mean(share[:10]),
            "steady": mean(share[10:]), "first_window_received": first, "windows_to_90": to_90,
            "per_window": [round(s, 2) for s in share]}


def run(name: str, spec: tuple, a, root: Path) -> dict:
    n_fakes, source, earned, churn, lead, anchored = spec
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = start_relay(root, address)
    crowd = anchor = None
    warm = a.warm_earned if earned else a.warm
    crowd_at = warm + (-warm if lead is None else lead)      # since the subscriber started
    try:
        time.sleep(1.0)
        sub = RelayClient(address, swarm="swarm", node_id="node", budget_k=a.k, budget_window_s=a.window,
                          filters={"task": ["gsm8k"]}).start()
        if anchored:                               # a useful publisher from the start: the subscriber is guarded
            anchor = RelayClient(address, swarm="swarm", node_id="anchor", subscribe=False).start()
        t_start = time.time()
        anchored_n = 0

        def background():
            nonlocal crowd, anchored_n
            now = time.time() - t_start
            if crowd is None and n_fakes and now >= crowd_at:
                crowd = mp.Process(target=_crowd, args=(address, n_fakes, a.fake_rate, warm + a.seconds + 2 - crowd_at,
                                                        source, warm if earned else 0.0, a.window if churn else 0.0))
                crowd.start()
            while anchor is not None and anchored_n < now * a.honest_rate:
                anchor.publish_bytes(rollout(f"anchor-{anchored_n}"), task="gsm8k")
                anchored_n += 1
        step_at, step = t_start + a.window, set()

        def take(deliveries):
            nonlocal step_at, step
            for d in deliveries:
                if not d.rollout_id.startswith("fake-junk-"):
                    step.add(d.sender)
            if time.time() >= step_at:             # a node's step: name who had a signal
                sub.mark_useful(step)
                step, step_at = set(), step_at + a.window
            return deliveries

        fakes_got = 0
        while time.time() - t_start < warm:
            background()
            fakes_got += len(take(sub.poll(timeout_s=0.05)))
        honest = RelayClient(address, swarm="swarm", node_id="honest", subscribe=False).start()
        published, got_idx = 0, set()
        t0 = time.time()
        while time.time() - t0 < a.seconds:
            background()
            while published < (time.time() - t0) * a.honest_rate:
                honest.publish_bytes(rollout(f"honest-{published}"), task="gsm8k")
                published += 1
            for d in take(sub.poll(timeout_s=0.05)):
                if d.sender == "honest":
                    got_idx.add(int(d.rollout_id.split("-")[1]))
        end = time.time() + 1.0
        while time.time() < end:
            got_idx.update(int(d.rollout_id.split("-")[1]) for d in take(sub.poll(timeout_s=0.05))
                           if d.sender == "honest")
        sub.close()
        honest.close()
        if anchor is not None:
            anchor.close()
        return {"scenario": name, "fakes": n_fakes, "crowd_lead_s": lead, "anchor": anchored,
                "fake_address": source or "the honest one's",
                "honest_published": published, "honest_received": len(got_idx), **_shares(got_idx, published, a)}
    finally:
        stop(relay, crowd)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--fakes", type=int, nargs="+", default=[8, 40, 200])
    ap.add_argument("--earned", type=int, default=40, help="fake ids that earn 'useful' first")
    ap.add_argument("--churn-ids", type=int, default=40, help="fake ids at a time in the churn scenarios")
    ap.add_argument("--fake-rate", type=float, default=1.0)
    ap.add_argument("--honest-rate", type=float, default=2.0)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--warm", type=float, default=4.0)
    ap.add_argument("--warm-earned", type=float, default=16.0, help="warm-up in which earned-N ids earn it")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--crowd", type=int, default=200, help="fake ids in the crowd-* and guarded-churn-* rows")
    ap.add_argument("--runs", type=int, default=1, help="runs of each scenario")
    ap.add_argument("--only", nargs="*", help="scenario names to run (default: all)")
    ap.add_argument("--relay-root", default=str(ROOT))
    a = ap.parse_args()
    root = Path(a.relay_root).resolve()
    rows = []
    for name, spec in scenarios(a).items():
        for _ in range(a.runs if not a.only or name in a.only else 0):
            rows.append(run(name, spec, a, root))
            write_json(a.json, {"relay_root": str(root), "k": a.k, "window_s": a.window, "seconds": a.seconds,
                                "honest_rate": a.honest_rate, "fake_rate": a.fake_rate, "rows": rows})
    write_json(a.json, {"relay_root": str(root), "k": a.k, "window_s": a.window, "seconds": a.seconds,
                        "honest_rate": a.honest_rate, "fake_rate": a.fake_rate, "rows": rows})
    print(f"{'scenario':<22}{'got/published':>14}{'first5':>8}{'first10':>8}{'steady':>8}{'1st win':>8}{'to 90%':>8}")
    for r in rows:
        print(f"{r['scenario']:<22}{r['honest_received']:>7}/{r['honest_published']:<6}{r['first5']!s:>8}"
              f"{r['first10']!s:>8}{r['steady']!s:>8}{r['first_window_received']!s:>8}{r['windows_to_90']!s:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
