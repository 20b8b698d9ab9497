"""Attack: subscribers that do not read, against the relay's memory (a real relay process, real
ZeroMQ sockets). Three scenarios, run side by side on the same relay code:

* control: two reading subscribers (they read everything and prove it, as the real client does);
* liars: two subscribers that never read but PING ``rx = 2**60`` (and a made-up MARK);
* non-readers: twenty subscribers that never read and claim nothing.

One publisher sends --mb-per-s MB/s of 1 MB rollouts for --seconds. Prints the relay's peak
RSS (VmHWM) per scenario and what each kind of subscriber was sent.

    python -m benchmarks.attacks.relay_memory [--seconds 10] [--relay-root DIR] [--json PATH]

--relay-root runs another checkout's relay (e.g. the code before a change, extracted with
``git archive REV relay | tar -x -C DIR``): the clients here speak that relay's protocol.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import zmq

from benchmarks.harness import ROOT, parser, vm_bytes, write_json
from ftis_edge.common.ports import free_port


def _protocol(root: Path):
    spec = importlib.util.spec_from_file_location("bench_relay_protocol", root / "relay" / "protocol.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_scenario(kind: str, root: Path, seconds: float, mb_per_s: float) -> dict:
    P = _protocol(root)
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(root))
    relay = subprocess.Popen([sys.executable, "-m", "relay", "--bind", addr, "--rate", "0", "--rate-mb", "0",
                              "--replay-mb", "64", "--log-level", "WARNING"], cwd=root, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = zmq.Context()
    socks = []

    def dealer(name: str, rcvhwm: int = 1000) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, rcvhwm)
        s.connect(addr)
        s.send_multipart([P.HELLO, orjson.dumps({"node_id": name, "protocol": P.RELAY_PROTOCOL})])
        socks.append(s)
        return s

    try:
        time.sleep(1.0)
        base_rss = vm_bytes(relay.pid, "VmRSS")
        pub = dealer("pub")
        n_subs = {"control": 2, "liars": 2, "non-readers": 20}[kind]
        subs = [dealer(f"{kind}-{i}", rcvhwm=1) for i in range(n_subs)]
        for s in subs:
            s.send_multipart([P.SUB, b"s", orjson.dumps({"epoch": None, "last_seq": 0})])
        time.sleep(0.5)
        read = [0] * n_subs
        marks = [""] * n_subs
        body = os.urandom(1 << 20)
        t0 = time.time()
        next_pub = next_ping = t0
        i = 0
        peak = 0
        while time.time() - t0 < seconds:
            now = time.time()
            if now >= next_pub:
                rid = f"r{i}"
                pub.send_multipart([P.PUB, b"s", P.pack_prefix("none", rid, "", "", len(body)) + body])
                i += 1
                next_pub += 1.0 / mb_per_s
            while pub.poll(0):
                pub.recv_multipart()
            if now >= next_ping:
                next_ping = now + 0.5
                for k, s in enumerate(subs):
                    if kind == "control":
                        s.send_multipart([P.PING, orjson.dumps({"t": 0, "rx": read[k], "mark": marks[k]})])
                    elif kind == "liars":
                        s.send_multipart([P.PING, orjson.dumps({"t": 0, "rx": 2 ** 60, "mark": os.urandom(8).hex()})])
                    else:
                        s.send_multipart([P.PING, orjson.dumps({"t": 0, "rx": 0})])
                pub.send_multipart([P.PING, orjson.dumps({"t": 0})])
            if kind == "control":
                for k, s in enumerate(subs):
                    while s.poll(0):
                        f = s.recv_multipart()
                        if f[0] == P.DELIVER:
                            read[k] += len(P.unpack_deliver(f[1])[6])
                        elif f[0] == getattr(P, "MARK", None) and f[1]:
                            marks[k] = f[1].hex()
            peak = max(peak, vm_bytes(relay.pid, "VmRSS"))
            time.sleep(0.01)
        hwm = vm_bytes(relay.pid)
        return {"scenario": kind, "subscribers": n_subs, "published_mb": i,
                "relay_rss_start_mb": round(base_rss / 2**20, 1), "relay_rss_peak_mb": round(max(peak, hwm) / 2**20, 1),
                "read_mb_per_subscriber": [round(r / 2**20, 1) for r in read] if kind == "control" else None}
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        relay.kill()
        relay.wait()


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--mb-per-s", type=float, default=40.0)
    ap.add_argument("--relay-root", default=str(ROOT))
    a = ap.parse_args()
    root = Path(a.relay_root).resolve()
    rows = [run_scenario(k, root, a.seconds, a.mb_per_s) for k in ("control", "liars", "non-readers")]
    write_json(a.json, {"relay_root": str(root), "seconds": a.seconds, "rows": rows})
    print(f"relay code: {root}")
    for r in rows:
        print(f"{r['scenario']:<12} subs {r['subscribers']:>3}  published {r['published_mb']:>4} MB  relay RSS "
              f"{r['relay_rss_start_mb']:>6.1f} -> peak {r['relay_rss_peak_mb']:>7.1f} MB"
              + (f"  read/sub {r['read_mb_per_subscriber']}" if r["read_mb_per_subscriber"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
