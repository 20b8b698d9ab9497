"""What a run directory holds between runs: make a fresh start fresh, a resume consistent,
and tell the user where things are when a node stops.

A fresh start must not inherit an older run's checkpoints (a later ``--resume`` would load
them) or adapters (``adapter/`` would mix two runs, the highest-numbered file being stale).
A resume keeps the checkpoints but drops the adapters: the ones written after the last
checkpoint belong to rounds that will be replayed, and the node re-exports the restored
weights before its first round anyway.
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from . import checkpoint
from .metrics import CONTROL_FILE, LOG_FILE, METRICS_FILE, read_metrics

ADAPTER_DIR = "adapter"
NODE_STDERR = "node.stderr"            # a dashboard-started node's stderr
ERROR_PREFIX = "ftis-edge: error: "    # how the CLI prints a failure


def reset(run_dir: Path) -> None:
    """``--overwrite``: delete everything of a previous run."""
    if Path(run_dir).exists():
        shutil.rmtree(run_dir)


def prepare_fresh(run_dir: Path) -> None:
    """A new run in ``run_dir``: no checkpoints, adapters, metrics or control state of an
    older one survive (node.log is appended to, so earlier diagnostics stay readable)."""
    run_dir = Path(run_dir)
    checkpoint.clear(run_dir)
    shutil.rmtree(run_dir / ADAPTER_DIR, ignore_errors=True)
    for name in (METRICS_FILE, CONTROL_FILE):
        (run_dir / name).unlink(missing_ok=True)


def prepare_resume(run_dir: Path) -> None:
    shutil.rmtree(Path(run_dir) / ADAPTER_DIR, ignore_errors=True)


def check_resumable(run_dir: Path, *, fresh_if_missing: bool) -> bool:
    """Whether a ``--resume`` can resume (True) or starts fresh (False, only when allowed).

    Raises CheckpointError in one line when there is nothing to resume and the user did not
    ask for a fresh start instead. Only presence is checked here; ``checkpoint.load_latest``
    verifies contents (and falls back to an older checkpoint)."""
    if checkpoint.complete(run_dir):
        checkpoint.refuse_untrusted(run_dir)
        return True
    if fresh_if_missing:
        return False
    why = "the run stopped before its first checkpoint" if (Path(run_dir) / METRICS_FILE).exists() \
        else "no run there yet"
    raise checkpoint.CheckpointError(
        f"--resume: no checkpoint in {Path(run_dir) / 'checkpoints'} ({why}); "
        f"use --resume-or-fresh to start fresh when there is none, or --overwrite to replace the run")


def latest_weights(run_dir: Path) -> Path | None:
    """The newest GGUF the node wrote for its generator (LoRA adapter or merged model)."""
    files = sorted((Path(run_dir) / ADAPTER_DIR).glob("*.gguf"), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def stop_summary(run_dir: Path, *, config: str | None = None, exit_code: int | None = None,
                 failure: str | None = None) -> str:
    """One line for the terminal when the dashboard closes: what happened and where things are."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    stop = next((r for r in reversed(records) if r.get("type") == "stop"), None)
    rounds = [r for r in records if r.get("type") == "round"]
    last = stop.get("round") if stop else (rounds[-1].get("round") if rounds else 0)
    if failure or (stop and stop.get("reason") == "error"):
        why = failure or stop.get("error") or "error"
        return (f"failed after round {last}: {why} — traceback in {run_dir / LOG_FILE}")
    if stop is None:
        state = f"exited with code {exit_code}" if exit_code not in (None, 0) else "still running"
        return f"node {state} after round {last} — run dir {run_dir}, watch with: ftis-edge watch {run_dir}"
    start = ["ftis-edge", "start"] + ([config] if config else []) + ["--run-dir", str(run_dir), "--resume"]
    parts = [f"stopped after round {last} ({stop.get('reason')}) — run dir {run_dir}",
             f"resume with: {shlex.join(start)}"]
    weights = latest_weights(run_dir)
    if weights is None:                     # HF backend: the weights live in the checkpoint only
        parts.append(f"weights in {run_dir / 'checkpoints'}")
    elif weights.name.startswith("adapter"):
        parts.append(f"export with: cp {shlex.quote(str(weights))} my-adapter.gguf "
                     f"(a llama.cpp LoRA adapter: --lora; ftis-edge eval --adapter)")
    else:
        parts.append(f"export with: cp {shlex.quote(str(weights))} my-model.gguf (a complete llama.cpp GGUF)")
    return ", ".join(parts)


def last_error_line(path: Path, offset: int = 0) -> str | None:
    """The one-line error a failed node printed (``ftis-edge: error: …``), from its stderr file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(ERROR_PREFIX):
            return ln[len(ERROR_PREFIX):]
    return lines[-1] if lines else None
