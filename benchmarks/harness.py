"""What every benchmark shares: its command line and where its result goes.

A benchmark runs from the repository root as a module (`.venv/bin/python -m benchmarks.bench_wire`,
`-m benchmarks.attacks.flood`), so it imports `ftis_edge`, `relay` and other benchmarks without
touching `sys.path`. Flags mean one thing everywhere: a benchmark prints its result (that is the
default); `--json PATH` also writes it to PATH as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parser(doc: str | None, *, result: bool = True) -> argparse.ArgumentParser:
    """The benchmark's argument parser: its docstring's first line as the description, the whole
    docstring under --help, and `--json PATH` where the benchmark has a result to write."""
    text = (doc or "").strip()
    ap = argparse.ArgumentParser(description=text.splitlines()[0] if text else None, epilog=_usage(text),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if result:
        ap.add_argument("--json", type=Path, metavar="PATH", default=None,
                        help="also write the result to PATH as JSON (printing is the default)")
    return ap


def _usage(text: str) -> str | None:
    rest = text.split("\n", 1)[1].strip() if "\n" in text else ""
    return rest or None


def write_json(path: Path | None, result) -> None:
    """Write the result where --json said (nothing without it); rewritten whole each call, so a
    benchmark may call it after every repetition and an interrupted run keeps what it measured."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def eval_args(**overrides) -> argparse.Namespace:
    """The arguments of `ftis-edge eval` with its own defaults and these overrides (for benchmarks that
    call ``evaluate.evaluate`` in process)."""
    from ftis_edge import evaluate
    eval_parser = argparse.ArgumentParser()
    evaluate.add_arguments(eval_parser)
    args = eval_parser.parse_args([])
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def vm_bytes(pid: int, key: str = "VmHWM") -> int:
    """A process's memory from /proc/PID/status in bytes: VmHWM (peak resident, the default) or
    VmRSS (resident now); 0 where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start_relay(root: Path, address: str) -> subprocess.Popen:
    """The relay of checkout ``root`` (this one, or --relay-root's older one for a before figure),
    bound to ``address``, quiet: the attacks read its figures over the socket, not its log."""
    return subprocess.Popen([sys.executable, "-m", "relay", "--bind", address, "--log-level", "WARNING"],
                            cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(relay, *children) -> None:
    """The end of an attack: its child processes (multiprocessing, None where never started)
    terminated, and the relay process it started killed."""
    for c in children:
        if c is not None:
            c.terminate()
            c.join(5)
    relay.kill()
    relay.wait()
