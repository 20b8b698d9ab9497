"""Attack: fake ids that came first keep a new honest publisher out of a budgeted subscriber.

--fakes ids (one connection each) publish zero-reward junk tagged like honest work, --fake-rate
rollouts/s each, from the start. After --warm s an honest publisher (the real client) arrives
and publishes --honest-rate rollouts/s. A budgeted subscriber (the real client, K = --k per
--window s, no publisher named useful: a node that has trained on nobody yet) takes what the
relay offers. Control: the same without fake ids. Prints the honest rollouts received and the
honest publisher's fair share (K / publishers per window, at most what it published).

    python -m benchmarks.attacks.sybil_first [--fakes 8 40] [--seconds 24] [--relay-root DIR] [--json PATH]

--relay-root runs another checkout's relay and client (e.g. the code before a change,
extracted with ``git archive REV relay | tar -x -C DIR``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, free_port, parser, write_json

if "--relay-root" in sys.argv:     # another checkout's relay AND client: its package must win the import
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--relay-root") + 1]).resolve()))

import zmq  # noqa: E402

from benchmarks.attacks.flood import hello_crowd  # noqa: E402  (after the path: its relay is the one under test)
from relay import protocol as P  # noqa: E402
from relay.client import RelayClient  # noqa: E402


def rollout(rid: str, task: str = "gsm8k", size: int = 2000) -> bytes:
    body = os.urandom(size)
    return P.pack_prefix("none", rid, task, "", len(body)) + body


def _fakes(address: str, n: int, rate: float, seconds: float) -> None:
    ctx = zmq.Context()
    socks = hello_crowd(ctx, address, range(n), prefix="fake")
    t0, sent = time.time(), 0
    while time.time() - t0 < seconds:
        due = int((time.time() - t0) * rate) + 1
        while sent < due:
            for i, s in enumerate(socks):
                try:
                    s.send_multipart([P.PUB, b"swarm", rollout(f"fake-{i}-{sent}")], zmq.NOBLOCK)
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


def run(n_fakes: int, a, root: Path) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = subprocess.Popen([sys.executable, "-m", "relay", "--bind", address, "--log-level", "WARNING"],
                             cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    crowd = None
    try:
        time.sleep(1.0)
        sub = RelayClient(address, swarm="swarm", node_id="node", budget_k=a.k, budget_window_s=a.window,
                          filters={"task": ["gsm8k"]}).start()
        if n_fakes:
            crowd = mp.Process(target=_fakes, args=(address, n_fakes, a.fake_rate, a.warm + a.seconds + 2))
            crowd.start()
        time.sleep(a.warm)
        honest = RelayClient(address, swarm="swarm", node_id="honest", subscribe=False).start()
        published, got = 0, 0
        t0 = time.time()
        while time.time() - t0 < a.seconds:
            while published < (time.time() - t0) * a.honest_rate:
                honest.publish_bytes(rollout(f"honest-{published}"), task="gsm8k")
                published += 1
            got += sum(d.sender == "honest" for d in sub.poll(timeout_s=0.05))
        end = time.time() + 1.0
        while time.time() < end:
            got += sum(d.sender == "honest" for d in sub.poll(timeout_s=0.05))
        windows = a.seconds / a.window
        fair = min(published, windows * a.k / (n_fakes + 1))
        sub.close()
        honest.close()
        return {"fakes": n_fakes, "honest_published": published, "honest_received": got,
                "fair_share": round(fair, 2), "share_of_fair": round(got / fair, 3) if fair else None}
    finally:
        if crowd is not None:
            crowd.terminate()
            crowd.join(5)
        relay.kill()
        relay.wait()


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--fakes", type=int, nargs="+", default=[8, 40])
    ap.add_argument("--fake-rate", type=float, default=3.0)
    ap.add_argument("--honest-rate", type=float, default=2.0)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--warm", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--relay-root", default=str(ROOT))
    a = ap.parse_args()
    root = Path(a.relay_root).resolve()
    rows = [run(n, a, root) for n in [0, *a.fakes]]
    write_json(a.json, {"relay_root": str(root), "k": a.k, "window_s": a.window, "seconds": a.seconds, "rows": rows})
    for r in rows:
        print(f"fake ids {r['fakes']:>3}: honest received {r['honest_received']:>3} of {r['honest_published']:>3} "
              f"published, fair share {r['fair_share']:>6}, {r['share_of_fair']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
