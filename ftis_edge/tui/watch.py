"""``ftis-edge watch RUN_DIR``: attach the dashboard to a running or finished node."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ftis_edge.tui.app import run_dashboard
from ftis_edge.tui.state import has_run_files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``watch`` options to a (sub)parser."""
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a node's run directory (holds metrics.jsonl, node.log, config.toml)")
    parser.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                        help="how often to re-read the run directory (default: 0.5)")


def check_run_dir(run_dir: str) -> str | None:
    """Why ``run_dir`` cannot be watched, in one line, or None when it can."""
    path = Path(run_dir)
    if not path.exists():
        return f"no run directory at {path}"
    if not path.is_dir():
        return f"{path} is a file, not a run directory"
    if not has_run_files(path):
        return (f"{path} is not a run directory (no metrics.jsonl, node.log or config.toml); "
                f"start a node with --run-dir {path} first")
    return None


def run(args: argparse.Namespace) -> int:
    """Open the dashboard on ``args.run_dir``; 2 (and one line on stderr) when it cannot."""
    problem = check_run_dir(args.run_dir)
    if problem is None and not args.interval > 0:
        problem = f"--interval must be a positive number of seconds, got {args.interval}"
    if problem is None and not sys.stdout.isatty():
        problem = "the dashboard needs a terminal (stdout is not one); read metrics.jsonl instead"
    if problem is not None:
        print(f"ftis-edge watch: {problem}", file=sys.stderr)
        return 2
    return run_dashboard(args.run_dir, poll_interval=args.interval)
