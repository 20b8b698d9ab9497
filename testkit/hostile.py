"""Hostile inputs an attacker plants: modules named like the standard library in a run directory
(issue 51 item 1, benchmarks/attacks/cwd_code.py) and a crafted best-weights state
(issue 51.8, benchmarks/attacks/best_state.py). The tests and the attack scripts build the same
ones from here."""
from __future__ import annotations

import re
from pathlib import Path

# --- code in the current directory --------------------------------------------------------------

NAMES = ("csv", "argparse", "json", "queue", "runpy", "logging", "threading", "pathlib", "random",
         "fractions", "decimal", "signal", "typing")

SHIM = '''import os, sys, importlib
with open({marker!r}, "a") as _f:
    _f.write(__name__ + "\\n")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
_real = importlib.import_module(__name__)
sys.modules[__name__] = _real
globals().update(_real.__dict__)
'''

CONSOLE_SCRIPT = "import sys\nfrom ftis_edge.cli import main\nsys.exit(main())\n"


def plant(run: Path, marker: Path) -> None:
    """Each of NAMES as a module in ``run`` that appends its name to ``marker`` when imported,
    then hands over the real module (the command still succeeds)."""
    for name in NAMES:
        (run / f"{name}.py").write_text(SHIM.format(marker=str(marker)), encoding="utf-8")


# --- a crafted best-weights state ---------------------------------------------------------------

GOOD = {"accuracy": 0.5, "n": 8, "interval": [0.2, 0.8], "base_accuracy": 0.25}
ESCAPES = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x1b]8;;http://x\x07\u202e"


def model_shapes():
    import torch
    return {"a.lora_A": torch.zeros(4, 8), "a.lora_B": torch.zeros(8, 4)}


def run_with_best(folder: Path, trainable: dict, info, round_: int = 2) -> Path:
    """``folder/run``: a run directory as a node leaves it, with best weights of ``round_``
    holding ``trainable`` and ``info`` (written by checkpoint.save_best, as a node would)."""
    import torch

    from ftis_edge.store import checkpoint, rundir
    from ftis_edge import config
    run = folder / "run"
    run.mkdir(parents=True)
    rundir.write_record(run, config.Config())
    model = model_shapes()
    moments = {"state": {i: {"exp_avg": torch.zeros_like(t), "exp_avg_sq": torch.zeros_like(t)}
                         for i, t in enumerate(model.values())}}
    checkpoint.save(run, 3, {"round": 3, "learner": {"mode": "lora", "trainable": model, "optimizer": moments,
                                                     "version": 3}})
    checkpoint.save_best(run, round_, trainable, info)
    return run


def make_huge(run: Path, gib: float) -> None:
    """Grow the best state to ``gib`` GiB (sparse: no disk used) with a manifest to match."""
    state = next((run / "checkpoints").glob("best-*")) / "state.safetensors"
    size = int(gib * 2**30)
    with open(state, "r+b") as fh:
        fh.truncate(size)
    manifest = state.parent / "manifest.json"
    manifest.write_text(re.sub(r'"bytes": \d+', f'"bytes": {size}', manifest.read_text()))
