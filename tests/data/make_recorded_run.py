"""Record tests/data/recorded_run/ from a real swarm: the dashboard's test fixture.

A real relay on loopback and three real nodes with tiny settings (the real config schema,
the real metric keys):

* ``smol-node`` (recorded): SmolLM2-135M, LoRA, llama.cpp generator — the dashboard's node;
* ``gemma-node``: Gemma 3 270M, another tokenizer (its samples are re-tokenized);
* ``full-hf``: SmolLM2-135M, full fine-tuning, HF generator.

Through the dashboard's control file the user stops ``smol-node`` (as ``q`` does) during its
round 4, so the record ends after round 4 with reason "user"; then the peers are stopped the
same way. Takes 15 minutes on 2 idle CPU cores, over an hour on busy ones; the models must be
installed (install.sh).

    python tests/data/make_recorded_run.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(HERE.parent)]

from ftis_edge import config  # noqa: E402
from ftis_edge.metrics.records import LOG_FILE, METRICS_FILE, read_metrics, write_control  # noqa: E402
from procs import RelayProc  # noqa: E402

OUT_DIR = HERE / "recorded_run"
RECORDED = "smol-node"
ROUNDS = 6
STOP_DURING = 4                # the last round
COMMON = {
    "node": {"rounds": ROUNDS, "checkpoint_every": ROUNDS},
    "model": {"threads": 1},
    "task": {"prompts_per_round": 2, "num_generations": 4, "max_completion_length": 32, "reward": "shaped"},
    "train": {"micro_batch": 8},
    "swarm": {"max_wait_s": 90.0, "max_peer_groups": 4, "name": "arith-smol"},
}
NODES = {
    RECORDED: {"train": {"learning_rate": 2e-4}},
    "gemma-node": {"model": {"spec": "gemma3-270m"}},
    "full-hf": {"model": {"backend": "hf"}, "train": {"trainable": "full", "learning_rate": 1e-5}},
}


def node_file(work: Path, node_id: str, relay: str) -> Path:
    merged = {s: dict(v) for s, v in COMMON.items()}
    for s, v in NODES[node_id].items():
        merged.setdefault(s, {}).update(v)
    merged["node"].update({"id": node_id, "run_dir": f"runs/{node_id}"})
    merged["swarm"]["relay"] = relay
    path = work / f"{node_id}.toml"
    path.write_text(config.to_toml(config.from_dict(merged), comments=False))
    return path


def rounds_done(run_dir: Path) -> int:
    return sum(1 for r in read_metrics(run_dir) if r.get("type") == "round")


def record(out_dir: Path = OUT_DIR) -> Path:
    work = Path(tempfile.mkdtemp(prefix="ftis-recorded-"))
    relay = RelayProc()
    relay.wait_ready()
    procs = {}
    try:
        for node_id in NODES:
            cfg = node_file(work, node_id, relay.address)
            procs[node_id] = subprocess.Popen(
                [sys.executable, "-m", "ftis_edge.cli", "start", str(cfg), "--headless"],
                cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        run = work / "runs" / RECORDED
        while rounds_done(run) < STOP_DURING - 1:
            time.sleep(1)
        write_control(run, stop=True)       # read before the next round: this one is the last
        procs[RECORDED].wait(timeout=3600)
        for node_id in NODES:               # peers stop after their current round
            write_control(work / "runs" / node_id, stop=True)
        for node_id, p in procs.items():
            if p.wait(timeout=3600) != 0:
                raise SystemExit(f"{node_id} failed (exit {p.returncode}); see {work / 'runs' / node_id}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        relay.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, LOG_FILE, "config.toml"):
        shutil.copyfile(run / name, out_dir / name)
    shutil.rmtree(work, ignore_errors=True)
    return out_dir


if __name__ == "__main__":
    print(f"wrote {record()}")
