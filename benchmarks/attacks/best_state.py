"""Attacks on `ftis-edge export` through a crafted best-weights state (issue 51.8).

A run directory someone sends you holds ``checkpoints/best-NNNNNN/`` (state + manifest, both
written by whoever sent it). Each variant below is a run directory as a node leaves it (its
record, a checkpoint of round 3 with the optimiser's moments) whose best state is crafted;
the real ``ftis-edge export RUN --eval-limit 0`` runs on it, and the script prints its exit
status, the seconds it took and its stderr line, and whether any terminal escape reached it:

    python -m benchmarks.attacks.best_state [--huge-gib 4] [--json PATH]

control: an honest best state, read by checkpoint.load_best (what export does before any model loads)
escapes: fields with OSC 52 (clipboard write), a screen clear, an OSC 8 hyperlink, a bidi override
not-a-table: the state's ``best`` entry a string / a list
huge: a (sparse) state of --huge-gib GiB with a manifest that matches its size
broadcast: (1,)-shaped tensors where the LoRA matrices go
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit.hostile import ESCAPES, GOOD, make_huge, model_shapes, run_with_best

ROOT = Path(__file__).resolve().parents[2]


def export(run: Path) -> dict:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "export", str(run), "--eval-limit", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    return {"code": r.returncode, "seconds": round(time.monotonic() - t0, 2),
            "line": (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or [""])[-1][:300],
            "escapes_reached_terminal": bool(re.search(r"[\x1b\x07\u202e]", out)),
            "traceback": "Traceback" in out}


def variants(huge_gib: float):
    import torch
    return {
        "escapes": (model_shapes(), {**GOOD, "accuracy": ESCAPES}, None),
        "not-a-table": (model_shapes(), "not a table", None),
        "huge": (model_shapes(), GOOD, huge_gib),
        "broadcast": ({"a.lora_A": torch.ones(1), "a.lora_B": torch.ones(1)}, GOOD, None),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--huge-gib", type=float, default=4.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        from ftis_edge.store import checkpoint
        t0 = time.monotonic()
        honest = checkpoint.load_best(run_with_best(Path(tmp) / "control", model_shapes(), GOOD))
        print(f"control      loads: round {honest['round']}, accuracy {honest['best']['accuracy']} "
              f"({time.monotonic() - t0:.2f} s)")
        for name, (trainable, info, gib) in variants(args.huge_gib).items():
            run = run_with_best(Path(tmp) / name, trainable, info)
            if gib:
                make_huge(run, gib)
            t0 = time.monotonic()
            try:
                checkpoint.load_best(run)
            except checkpoint.CheckpointError:
                pass
            check_s = time.monotonic() - t0
            results[name] = {**export(run), "load_best_s": round(check_s, 3)}
            print(f"{name:12s} exit {results[name]['code']}  {results[name]['seconds']:5.1f} s "
                  f"(load_best {check_s:.3f} s)  "
                  f"escapes reached the terminal: {results[name]['escapes_reached_terminal']}  "
                  f"traceback: {results[name]['traceback']}\n             {results[name]['line']!r}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
