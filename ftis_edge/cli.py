"""`ftis-edge` — start · init · eval · watch · demo · export.

Errors a user can cause (bad config, missing file, unknown model: every ``FtisError``) print
one line and exit 2; any other failure prints one line and exits 1, with the traceback in the
run's node.log.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from . import __version__
from .store import rundir


def _die(msg: str, code: int = 2) -> int:
    from .common.text_safety import shown
    # messages name paths and settings read from disk: each line printed inert
    print(rundir.ERROR_PREFIX + "\n".join(shown(line) for line in str(msg).split("\n")), file=sys.stderr)
    return code


# --- start ------------------------------------------------------------------------------
def _add_start(sub) -> None:
    p = sub.add_parser("start", help="run a node (dashboard in a terminal, plain logs otherwise)",
                       description="Run one node: generate, share, train with F-TIS, round after round.")
    p.add_argument("config", nargs="?", help="node.toml (default: the offline default node)")
    p.add_argument("--relay", help="relay address, e.g. tcp://host:5555 (overrides swarm.relay)")
    p.add_argument("--headless", action="store_true", help="plain log lines instead of the dashboard")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run directory's newest good checkpoint (an error when there is none), "
                        "with the run's own settings (RUN_DIR/config.toml) unless a node file is given; the model and "
                        "LoRA settings the checkpoint was made with must not change")
    p.add_argument("--resume-or-fresh", action="store_true",
                   help="like --resume, but start fresh when the run directory has no checkpoint yet")
    p.add_argument("--overwrite", action="store_true", help="DELETE the run already in the run directory and start over")
    p.add_argument("--rounds", type=int, help="override node.rounds")
    p.add_argument("--run-dir", help="override node.run_dir")
    p.add_argument("--node-id", help="override node.id")
    # a dashboard's node: its log lines go to node.log only (stderr keeps the one-line failure)
    p.add_argument("--log-file-only", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=_run_start)


def _run_start(args) -> int:
    from .config import ConfigError, load, resolve_relay
    from .errors import FtisError
    from .metrics.records import METRICS_FILE

    overrides = {}
    if args.relay is not None:
        overrides["swarm.relay"] = args.relay
    if args.rounds is not None:
        overrides["node.rounds"] = args.rounds
    if args.run_dir is not None:
        overrides["node.run_dir"] = args.run_dir
    if args.node_id is not None:
        overrides["node.id"] = args.node_id
    resume = args.resume or args.resume_or_fresh
    try:
        cfg = load(args.config, overrides)
        if resume and args.config is None:
            cfg = _the_record(cfg, overrides)
        elif resume:
            cfg = _as_the_run_was(cfg, args, overrides)
        if cfg.mode != "alone":
            resolve_relay(cfg.swarm.relay)
    except ConfigError as e:
        return _die(str(e))
    run_dir = cfg.run_path
    if args.overwrite and resume:
        return _die("--overwrite deletes the run that --resume would continue: pick one")
    from .store import runlock
    try:        # one live node per run directory: held until this process ends (a dashboard hands it on)
        runlock.acquire(run_dir, rundir.command_name())
    except FtisError as e:
        return _die(str(e))
    if (run_dir / METRICS_FILE).exists() and not (resume or args.overwrite):
        return _die(rundir.holds_a_run(run_dir))
    if args.overwrite:
        rundir.reset(run_dir)
    notes: list[str] = []
    if resume:
        from .store import resume_check
        try:      # checked here too, so that the dashboard never opens on nothing to resume
            if rundir.check_resumable(run_dir, fresh_if_missing=args.resume_or_fresh):
                # before anything loads: a setting the checkpoint needs that changed is refused
                notes = resume_check.check(run_dir, cfg, node_file=args.config)
                done = rundir.complete_words(run_dir, cfg.node.rounds, args.config)
                if done:             # nothing to train: said before the model loads or the relay is joined
                    print(done, file=sys.stderr)
                    return 0
        except FtisError as e:
            return _die(str(e))

    if args.headless or not sys.stdout.isatty():
        from .run.logs import quiet_third_party
        quiet_third_party()        # before torch is imported: it imports tqdm
        return _run_node(cfg, resume=resume, fresh_if_missing=args.resume_or_fresh,
                         console_log=not args.log_file_only, notes=notes)

    # Dashboard: the node runs as a child process writing the run directory; the UI only reads
    # it, so drawing never slows training. The node takes the run directory's lock itself.
    runlock.release()
    run_dir.mkdir(parents=True, exist_ok=True)
    from .common.child import python_command
    cmd = python_command("-m", "ftis_edge.cli", "start", "--headless")
    if args.config:
        cmd.append(args.config)
    for flag, value in (("--relay", args.relay), ("--rounds", args.rounds), ("--run-dir", args.run_dir),
                        ("--node-id", args.node_id)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.resume_or_fresh:
        cmd.append("--resume-or-fresh")
    elif args.resume:
        cmd.append("--resume")
    proc, stderr_file = rundir.spawn_node(cmd, run_dir)
    _stop_node_on_hangup(proc)
    from .tui import run_dashboard
    code = run_dashboard(run_dir, node_process=proc, node_stderr=stderr_file)
    from .store.record_watch import edits_line
    print(rundir.stop_summary(run_dir, config=args.config, exit_code=proc.poll(),
                              failure=rundir.last_error_line(*stderr_file) if proc.poll() else None,
                              edited=edits_line(run_dir, running=False, program=rundir.command_name())))
    return code


def _the_record(cfg, overrides: dict):
    """``start --run-dir RUN --resume`` without a node file resumes with the run's own settings,
    RUN/config.toml (the record; an edit there applies), not the default node's."""
    from .config import ConfigError, load
    record = cfg.run_path / rundir.CONFIG_FILE
    if not record.is_file():
        return cfg
    try:
        was = load(record, {**overrides, "node.run_dir": str(cfg.run_path)})
    except ConfigError as e:
        raise ConfigError(f"{record.resolve()} (the run's settings, which --resume without a node file uses): "
                          f"{e}") from None
    print(f"note: resuming with the run's settings, {record} (edit it to change what may change on "
          f"resume: rounds, eval, threads, ...)", file=sys.stderr)
    return was


def _as_the_run_was(cfg, args, overrides: dict):
    """A resume continues the run as it was: its relay (swarm, keys) and its node id, unless the
    command line or the config file says otherwise (``--relay ""`` resumes alone)."""
    from .config import ConfigError, load
    previous = cfg.run_path / rundir.CONFIG_FILE
    if not previous.is_file():
        return cfg
    try:
        was = load(previous)
    except ConfigError:
        return cfg                       # resume reports a broken run directory itself
    carried = {"node.run_dir": str(cfg.run_path)}        # the id below must not move the run
    said = []
    if args.relay is None and not cfg.swarm.relay and was.swarm.relay:
        carried.update({"swarm.relay": was.swarm.relay, "swarm.name": was.swarm.name,
                        "swarm.client_keys": was.swarm.client_keys, "swarm.server_key": was.swarm.server_key})
        said.append(f"relay {was.swarm.relay} (swarm '{was.swarm.name}')")
    if args.node_id is None and was.node.id and was.node.id != cfg.node_id:
        carried["node.id"] = was.node.id
        said.append(f"node id {was.node.id}")
    if not said:
        return cfg
    alone = "--relay '' trains alone, " if "swarm.relay" in carried else ""
    print(f"note: resuming {cfg.run_path} as it ran: {' and '.join(said)} (from {previous}; "
          f"{alone}--node-id names it otherwise)", file=sys.stderr)
    return load(args.config, {**overrides, **carried})


def _stop_node_on_hangup(proc) -> None:
    """A closed terminal (SIGHUP) ends the dashboard; its node runs in a session of its own, so
    it is told here, as by SIGTERM: it stops after its round, with a checkpoint."""
    if not hasattr(signal, "SIGHUP"):
        return

    def on_hangup(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        os._exit(128 + signum)       # the terminal is gone: nothing left to draw or restore

    signal.signal(signal.SIGHUP, on_hangup)


def _run_node(cfg, *, resume: bool, fresh_if_missing: bool = False, console_log: bool = True,
              notes: list[str] = ()) -> int:
    from .errors import FtisError, one_line
    from .metrics.records import LOG_FILE
    from .run.node import Node
    from relay.keys import KeyFileError
    from .store.checkpoint import CheckpointError
    say_resume = True
    try:
        node = Node(cfg, resume=resume, fresh_if_missing=fresh_if_missing, console_log=console_log)
        import logging
        for note in notes:        # what the resume changes: on the console and in node.log (the record)
            logging.getLogger("ftis_edge.resume").warning("%s", note)
        return node.run()
    except (FtisError, KeyFileError) as e:
        say_resume = not isinstance(e, CheckpointError)      # resuming would meet the same checkpoint
        return _die(one_line(e))
    except KeyboardInterrupt:
        print("ftis-edge: aborted", file=sys.stderr)
        return 130
    except Exception as e:             # a bug or the environment: one line here, the traceback in node.log
        log_file = cfg.run_path / LOG_FILE
        if not log_file.exists():
            raise
        return _die(f"{one_line(e)} (traceback in {log_file})", code=1)
    finally:
        command = rundir.resume_command(cfg.run_path) if say_resume else None
        if command:     # every exit that left a checkpoint says how to continue
            print(f"resume: {command}", file=sys.stderr)
        _ctrl_c_now_exits()


def _ctrl_c_now_exits() -> None:
    """The node has stopped and said so (its stop record is written): a Ctrl-C while the
    interpreter tears down (threads, torch, the grader pool) leaves at once with 130, not a
    KeyboardInterrupt traceback from whatever was being torn down."""
    def leave(signum, _frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, leave)


# --- init -------------------------------------------------------------------------------
def _add_init(sub) -> None:
    p = sub.add_parser("init", help="write a fully commented node.toml",
                       description="Write a node file with every setting, its default and what it means; edit "
                                   "it, then `ftis-edge start FILE`. Relative paths in it are relative to its folder.")
    p.add_argument("path", nargs="?", default="node.toml", help="the file to write (default node.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--task", help="the [task] section to write: arith (default), gsm8k, math500, reasoning_gym "
                                  "(a mix a small model can start on), jsonl")
    p.set_defaults(func=_run_init)


# `init --task reasoning_gym`: the README's mix, easy enough for a 135M model to get rewards
GYM_MIX = {
    "chain_sum": {"weight": 2, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "operators": ["+", "-", "*"], "allow_parentheses": False, "allow_negation": False},
    "leg_counting": {"weight": 0.5, "min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 3},
}


def _run_init(args) -> int:
    from .config import Config, to_toml
    path = Path(args.path)
    if path.exists() and not args.force:
        return _die(f"{path} exists (use --force to overwrite)")
    cfg = Config()
    if args.task:
        from dataclasses import replace
        from .config import ConfigError, from_dict
        task = {"name": args.task}
        if args.task == "reasoning_gym":
            task.update(reward="shaped", datasets=GYM_MIX)
        try:
            cfg = replace(cfg, task=from_dict({"task": task}).task)
        except ConfigError as e:
            return _die(f"--task: {e}")
    path.write_text(to_toml(cfg), encoding="utf-8")
    print(f"wrote {path} — edit it, then: {rundir.command_name()} start {path}")
    from .learn.fit import summary
    print(summary(cfg))          # will the file's model fit on this machine?
    return 0


# --- eval / watch live in their own modules ----------------------------------------------
def _add_eval(sub) -> None:
    from . import evaluate
    p = sub.add_parser("eval", help="accuracy of a model (+ adapter) on a task",
                       description="Evaluate a model, or a run directory's newest weights, on a task "
                                   "(default arith, which needs no download).")
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
    p = sub.add_parser("watch", help="open the dashboard on a running or finished run directory",
                       description="Open the dashboard on a run directory: live while its node runs, or a finished "
                                   "run. Watching never stops the node: q leaves; S then y asks it to stop after "
                                   "its round.")
    watch.add_arguments(p)
    p.set_defaults(func=watch.run)


def _add_demo(sub) -> None:
    from . import demo
    p = sub.add_parser("demo", help="a local swarm: a relay and three different nodes, the dashboard on one",
                       description="A relay on loopback and three small, different nodes (LoRA on llama.cpp, "
                                   "full fine-tuning on HF, Gemma 3 with another tokenizer), the dashboard "
                                   "on the first; q stops them all, each with a checkpoint.")
    demo.add_arguments(p)
    p.set_defaults(func=demo.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftis-edge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ftis-edge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_start(sub)
    _add_init(sub)
    _add_eval(sub)
    _add_watch(sub)
    _add_demo(sub)
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
