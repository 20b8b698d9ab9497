"""`ftis-edge` — start · init · eval · watch · export.

Errors a user can cause (bad config, missing file, unknown model) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from . import __version__


def _die(msg: str, code: int = 2) -> int:
    print(f"ftis-edge: error: {msg}", file=sys.stderr)
    return code


# --- start ------------------------------------------------------------------------------
def _add_start(sub) -> None:
    p = sub.add_parser("start", help="run a node (dashboard in a terminal, plain logs otherwise)",
                       description="Run one node: generate, share, train with F-TIS, round after round.")
    p.add_argument("config", nargs="?", help="node.toml (default: the offline default node)")
    p.add_argument("--relay", help="relay address, e.g. tcp://host:5555 (overrides swarm.relay)")
    p.add_argument("--headless", action="store_true", help="plain log lines instead of the dashboard")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run in the run directory")
    p.add_argument("--rounds", type=int, help="override node.rounds")
    p.add_argument("--run-dir", help="override node.run_dir")
    p.add_argument("--node-id", help="override node.id")
    p.set_defaults(func=_run_start)


def _run_start(args) -> int:
    from .config import ConfigError, load
    from .metrics import METRICS_FILE

    overrides = {}
    if args.relay is not None:
        overrides["swarm.relay"] = args.relay
    if args.rounds is not None:
        overrides["node.rounds"] = args.rounds
    if args.run_dir is not None:
        overrides["node.run_dir"] = args.run_dir
    if args.node_id is not None:
        overrides["node.id"] = args.node_id
    try:
        cfg = load(args.config, overrides)
    except ConfigError as e:
        return _die(str(e))
    run_dir = cfg.run_path
    if (run_dir / METRICS_FILE).exists() and not (args.resume or args.overwrite):
        return _die(f"{run_dir} already holds a run: --resume to continue it, --overwrite to replace it, "
                    f"or --run-dir for a new one")
    if args.overwrite and not args.resume:
        from .node import reset_run_dir
        reset_run_dir(run_dir)

    if args.headless or not sys.stdout.isatty():
        return _run_node(cfg, resume=args.resume)

    # Dashboard: the node runs as a child process writing the run directory; the UI only reads
    # it, so drawing never slows training.
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ftis_edge.cli", "start", "--headless"]
    if args.config:
        cmd.append(args.config)
    for flag, value in (("--relay", args.relay), ("--rounds", args.rounds), ("--run-dir", args.run_dir),
                        ("--node-id", args.node_id)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.resume:
        cmd.append("--resume")
    with open(run_dir / "node.stderr", "ab") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    from .tui import run_dashboard
    code = run_dashboard(run_dir, node_process=proc)
    if proc.poll() is None:
        print(f"node still running (pid {proc.pid}); watch it with: ftis-edge watch {run_dir}")
    return code


def _run_node(cfg, *, resume: bool) -> int:
    from .models import ModelError
    from .node import Node
    from .tasks import TaskError
    from relay.keys import KeyError_
    try:
        return Node(cfg, resume=resume).run()
    except (ModelError, TaskError, KeyError_) as e:
        return _die(str(e))
    except KeyboardInterrupt:
        print("ftis-edge: aborted", file=sys.stderr)
        return 130


# --- init -------------------------------------------------------------------------------
def _add_init(sub) -> None:
    p = sub.add_parser("init", help="write a fully commented node.toml")
    p.add_argument("path", nargs="?", default="node.toml")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=_run_init)


def _run_init(args) -> int:
    from .config import Config, to_toml
    path = Path(args.path)
    if path.exists() and not args.force:
        return _die(f"{path} exists (use --force to overwrite)")
    path.write_text(to_toml(Config()), encoding="utf-8")
    print(f"wrote {path} — edit it, then: ftis-edge start {path}")
    return 0


# --- eval / watch live in their own modules ----------------------------------------------
def _add_eval(sub) -> None:
    from . import evaluate
    p = sub.add_parser("eval", help="accuracy of a model (+ adapter) on a task",
                       description="Evaluate a model on gsm8k, math500 or arith.")
    evaluate.add_arguments(p)
    p.set_defaults(func=evaluate.run)


def _add_export(sub) -> None:
    from . import export
    p = sub.add_parser("export", help="a run's weights as PEFT, GGUF (+ quantized), Ollama Modelfile, model card",
                       description=export.__doc__.splitlines()[0])
    export.add_arguments(p)
    p.set_defaults(func=export.run)


def _add_watch(sub) -> None:
    from .tui import watch
    p = sub.add_parser("watch", help="open the dashboard on a running or finished run directory")
    watch.add_arguments(p)
    p.set_defaults(func=watch.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftis-edge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ftis-edge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_start(sub)
    _add_init(sub)
    _add_eval(sub)
    _add_watch(sub)
    _add_export(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
