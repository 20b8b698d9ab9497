"""Run the reproduction's batches: a local relay, one peer, the receivers, then a final eval of each.

    .venv/bin/python experiments/repro/run.py methods horizontal --seeds 0 1 2 [--rounds 10]
    .venv/bin/python experiments/repro/run.py --list

Layout: OUT/BATCH/sSEED/{peer,RECEIVER}/ are ordinary run directories (metrics.jsonl, node.log,
adapter/), plus eval-id.json / eval-ood.json per receiver. A finished receiver (stop record +
both evals) is skipped, so an interrupted sweep resumes where it stopped. Every node uses one
thread: a batch is 3–9 processes sharing the CPU, and the peer sets the pace.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batches import BATCHES, COMMON, PEER, RECEIVER, merge  # noqa: E402
from ftis_edge import config as cfgmod  # noqa: E402
from ftis_edge.metrics import read_metrics  # noqa: E402

BIN = ROOT / ".venv" / "bin"
EVAL_SETS = {"id": "1,2", "ood": "3"}    # arith levels: the training mix, and a harder held-out level


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(data: dict, path: Path) -> Path:
    cfg = cfgmod.from_dict(data)               # validates: a typo fails here, not an hour later
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cfgmod.to_toml(cfg, comments=False))
    return path


def completed(records: list[dict]) -> bool:
    """A run that stopped because it did all its rounds (not a crash, signal or user stop)."""
    stops = [r for r in records if r.get("type") == "stop"]
    return bool(stops) and stops[-1].get("reason") == "steps"


def finished(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").exists() and completed(read_metrics(run_dir))


def receiver_configs(batch, seed: int, rounds: int, out: Path, addr: str, swarm: str) -> dict[str, dict]:
    cfgs = {}
    for name, over in batch.receivers.items():
        alone = over.get("swarm", {}).get("collaboration") == "alone"
        # One node id and seed for every receiver: same prompts, same sampling seeds, same LoRA
        # init — a paired comparison in which only the compared setting differs.
        cfgs[name] = merge(COMMON, RECEIVER, {
            "node": {"id": "learner", "seed": seed, "rounds": rounds, "run_dir": str(out / name)},
            "swarm": {"relay": "" if alone else addr, "name": swarm, "collaboration": batch.collaboration},
        }, over)
    return cfgs


def start_node(cfg_path: Path, log_path: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "ftis-edge"), "start", str(cfg_path), "--headless", "--overwrite"],
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)          # the node finishes its round and checkpoints
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def train(batch, seed: int, rounds: int, out: Path, timeout_s: float) -> None:
    port = free_port()
    addr, swarm = f"tcp://127.0.0.1:{port}", f"repro-{batch.name}-s{seed}"
    cfgs = receiver_configs(batch, seed, rounds, out, addr, swarm)
    todo = {n: c for n, c in cfgs.items() if not finished(out / n)}
    if not todo:
        return
    print(f"[{batch.name} s{seed}] training {', '.join(todo)} ({rounds} rounds)", flush=True)
    relay = subprocess.Popen([str(BIN / "ftis-relay"), "--bind", addr], stdout=(out / "relay.out").open("w"),
                             stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    procs = {}
    try:
        time.sleep(1.0)
        if any(c["swarm"]["relay"] for c in todo.values()):     # only isolated receivers left: no peer
            peer_cfg = merge(COMMON, batch.peer, PEER, {
                # The peer outlasts the receivers (it is stopped when they are done).
                "node": {"id": "peer", "seed": 1000 + seed, "rounds": rounds + 5, "run_dir": str(out / "peer")},
                "swarm": {"relay": addr, "name": swarm, "collaboration": batch.collaboration}})
            procs["peer"] = start_node(write_config(peer_cfg, out / "peer.toml"), out / "peer.out")
        for name, c in todo.items():
            procs[name] = start_node(write_config(c, out / f"{name}.toml"), out / f"{name}.out")
        deadline = time.time() + timeout_s
        while time.time() < deadline and any(p.poll() is None for n, p in procs.items() if n != "peer"):
            time.sleep(2.0)
        for name, p in procs.items():
            if name != "peer" and p.returncode not in (0, None):
                print(f"[{batch.name} s{seed}] {name} exited with {p.returncode}: see {out / name}.out", flush=True)
    finally:
        for p in procs.values():
            stop(p)
        stop(relay, 5.0)


def last_adapter(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "adapter").glob("adapter-v*.gguf"))
    return found[-1] if found else None


def eval_cmd(run_dir: Path | None, which: str, limit: int, precision: str, out_json: Path) -> list[str]:
    cmd = [str(BIN / "ftis-edge"), "eval", "--task", "arith", "--level", EVAL_SETS[which], "--limit", str(limit),
           "--threads", "1", "--max-new-tokens", "64", "--precision", precision, "--quiet", "--json", str(out_json)]
    if run_dir is not None:
        cmd += ["--adapter", str(last_adapter(run_dir))]
    return cmd


def run_evals(jobs: list[tuple[list[str], Path]], parallel: int = 2) -> None:
    """Run eval commands, `parallel` at a time (each is single-threaded)."""
    running: list[tuple[subprocess.Popen, Path]] = []
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < parallel:
            cmd, log = pending.pop(0)
            running.append((subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT), log))
        time.sleep(1.0)
        for p, log in list(running):
            if p.poll() is not None:
                running.remove((p, log))
                if p.returncode:
                    print(f"eval failed ({p.returncode}): see {log}", flush=True)


def eval_jobs(batch, seed: int, out: Path, limit: int) -> list:
    jobs = []
    for name in batch.receivers:
        rd = out / name
        if not finished(rd) or last_adapter(rd) is None:
            continue
        precision = merge(RECEIVER, batch.receivers[name])["model"]["precision"]   # evaluate as it generated
        for which in EVAL_SETS:
            target = rd / f"eval-{which}.json"
            if not target.exists():
                jobs.append((eval_cmd(rd, which, limit, precision, target), rd / f"eval-{which}.out"))
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batches", nargs="*", help=f"any of: {', '.join(BATCHES)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--eval-limit", type=int, default=24, help="prompts per eval set")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "repro")
    ap.add_argument("--timeout-min", type=float, default=60.0, help="per batch and seed")
    ap.add_argument("--sweep-seeds", type=int, nargs="*", default=[0], help="seeds the `sweep` batch runs")
    ap.add_argument("--no-eval", action="store_true", help="train only (evaluate later by re-running)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list or not args.batches:
        for b in BATCHES.values():
            print(f"{b.name:12s} {b.about}")
        return 0
    unknown = [b for b in args.batches if b not in BATCHES]
    if unknown:
        ap.error(f"unknown batch {', '.join(unknown)}; choose from {', '.join(BATCHES)}")
    base = args.out / "base"
    base.mkdir(parents=True, exist_ok=True)
    run_evals([(eval_cmd(None, w, args.eval_limit, "f16", base / f"eval-{w}.json"), base / f"eval-{w}.out")
               for w in EVAL_SETS if not (base / f"eval-{w}.json").exists()])
    for seed in args.seeds:
        for name in args.batches:
            if name == "sweep" and seed not in args.sweep_seeds:
                continue
            batch, out = BATCHES[name], args.out / name / f"s{seed}"
            out.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            train(batch, seed, args.rounds, out, args.timeout_min * 60)
            if not args.no_eval:
                run_evals(eval_jobs(batch, seed, out, args.eval_limit))
            print(f"[{name} s{seed}] done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
