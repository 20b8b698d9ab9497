"""What each quantised file costs against F16, paired on the same held-out prompts (issue 63 item 9).

    .venv/bin/python -m benchmarks.quant_cost RUN_DIR [--limit 50] [--threads 2] [--json out.json]

Exports the run once per quantisation (``export --quant Q --eval-limit 0``, into a temporary
folder), then evaluates model-f16.gguf and each model-<q>.gguf greedily on the same first
``--limit`` held-out prompts of the run's task, exactly as ``export`` does, and prints each
file's accuracy and its change against F16 with the paired 95% interval (only prompts whose
answer changed add noise). The figure behind ``export``'s default: q8_0 below 1B parameters.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ftis_edge.export import QUANTS, _eval, change_words, export_run, paired
from ftis_edge.store.rundir import load_config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--limit", type=int, default=50, help="held-out prompts (default 50)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    cfg = load_config(Path(a.run_dir))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="quant-cost-") as tmp:
        files = {}
        for quant in QUANTS[1:]:            # q8_0, q4_k_m: each export also writes model-f16.gguf
            out = Path(tmp) / quant
            export_run(a.run_dir, out, quant=quant, eval_limit=0, log=lambda *_: None)
            files.setdefault("f16", out / "model-f16.gguf")
            files[quant] = out / f"model-{quant}.gguf"
        for name, path in files.items():
            t0 = time.time()
            rows[name] = _eval(cfg, str(path), "quantized", a.limit, a.threads)
            rows[name]["seconds"] = time.time() - t0
    ref = rows["f16"]
    print(f"{cfg.model.spec}, task {cfg.task.name}, {a.limit} held-out prompts, greedy")
    result = {"model": cfg.model.spec, "task": cfg.task.name, "prompts": a.limit, "files": {}}
    for name, r in rows.items():
        lo, hi = r["accuracy_ci95"]
        cost = paired(r, ref)
        said = "reference" if name == "f16" else change_words(cost, "F16")
        print(f"  {name:7s} {100 * r['accuracy']:5.1f}% [{100 * lo:.0f}–{100 * hi:.0f}]  {said}  ({r['seconds']:.0f} s)")
        result["files"][name] = {"accuracy": r["accuracy"], "interval": [lo, hi], "cost": cost}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
