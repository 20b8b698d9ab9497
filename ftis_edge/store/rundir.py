"""The run directory's one owner: its layout, what reads it (is it a run? its config, its
newest weights), what starts a node in it, a fresh start fresh, a resume consistent, and
what the user is told when a node stops.

    RUN_DIR/config.toml          the node's resolved config (CONFIG_FILE)
    RUN_DIR/metrics.jsonl        records (metrics.METRICS_FILE), node.log, control.json
    RUN_DIR/adapter/latest.gguf  the generator's newest weights (ADAPTER_DIR, LATEST; sync.py writes them)
    RUN_DIR/checkpoints/         verified checkpoints (checkpoint.py, checkpoint.DIR)
    RUN_DIR/node.stderr          a dashboard-started node's stderr (NODE_STDERR)

A fresh start must not inherit an older run's checkpoints (a later ``--resume`` would load
them) or adapters (``adapter/`` would mix two runs, the highest-numbered file being stale).
A resume keeps the checkpoints but drops the adapters: the ones written after the last
checkpoint belong to rounds that will be replayed, and the node re-exports the restored
weights before its first round anyway.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from . import checkpoint
from ..common.child import python_env
from ..errors import FtisError
from ..metrics.records import CONTROL_FILE, LOG_FILE, METRICS_FILE, read_metrics, round_records

CONFIG_FILE = "config.toml"
ADAPTER_DIR = "adapter"
LATEST = "latest.gguf"                 # in ADAPTER_DIR: a hard link to the newest adapter (LoRA) or merged model (full)
NODE_STDERR = "node.stderr"            # a dashboard-started node's stderr
ERROR_PREFIX = "ftis-edge: error: "    # how the CLI prints a failure


class RunDirError(FtisError):
    """A run directory lacks what a command needs from it; the message says what."""


# --- reading a run ------------------------------------------------------------------------

def is_run_dir(path) -> bool:
    p = Path(path).expanduser()
    return p.is_dir() and (p / CONFIG_FILE).is_file()


TRUST_TASK_CODE_ENV = "FTIS_EDGE_TRUST_TASK_CODE"


def load_config(run_dir: Path):
    """The run's resolved config (RunDirError naming the run when it does not load).

    Run directories get shared ("export my run for me"), so loading one must not run code: a
    task named by a class path (``module:Class``) is imported when built, and is refused here
    unless the user says they trust it. Built-in tasks and installed entry points (code the
    user installed) are fine."""
    from ..config import ConfigError, load
    try:
        cfg = load(Path(run_dir) / CONFIG_FILE)
    except ConfigError as e:
        raise RunDirError(f"{run_dir}: {e}") from None
    name = cfg.task.name
    if ":" in name and not name.startswith("reasoning_gym:") and os.environ.get(TRUST_TASK_CODE_ENV) != "1":
        raise RunDirError(f"{run_dir}: its task {name!r} is Python code, which runs when the task is built; "
                          f"if you trust this run directory, run again with {TRUST_TASK_CODE_ENV}=1")
    _check_model_choice(Path(run_dir), cfg.model.spec)
    return cfg


def _check_model_choice(run_dir: Path, spec: str) -> None:
    """A run's model folder runs no code (refused here, before any checkpoint or loader), and a
    model path outside the run directory is said aloud: a shared run must not pick, unseen,
    a model elsewhere on this machine."""
    from ..models.model_code import refuse_model_code
    from ..models.resolve import ALIASES
    if spec in ALIASES:
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        refuse_model_code(path, spec, RunDirError)
    if path.exists() or spec.startswith(("/", ".", "~")):
        try:
            inside = path.resolve().is_relative_to(run_dir.expanduser().resolve())
        except OSError:
            inside = False
        if not inside:
            from ..common.text_safety import shown
            print(shown(f"note: {run_dir / CONFIG_FILE} chooses the model {path.resolve()}, outside "
                        f"the run directory"), file=sys.stderr)


def latest_weights(run_dir: Path) -> tuple[Path, str] | None:
    """(the newest GGUF the node wrote for its generator, "adapter" or "model"), or None.

    What the file is comes from its ``general.type``, not its name: ``latest.gguf`` is a hard
    link to either a LoRA adapter or a merged model."""
    from ..models.gguf_io import read_gguf_field
    folder = Path(run_dir) / ADAPTER_DIR
    latest = folder / LATEST
    if not latest.is_file():
        files = sorted(folder.glob("*.gguf"), key=lambda p: p.stat().st_mtime)
        if not files:
            return None
        latest = files[-1]
    try:
        kind = "adapter" if read_gguf_field(latest, "general.type") == "adapter" else "model"
    except Exception:  # noqa: BLE001 - gguf raises many kinds for a file that is not (yet) a GGUF
        return None
    return latest, kind


def eval_weights(run_dir) -> tuple[str, str | None]:
    """(model spec, adapter path or None) of a run's newest weights, for ``eval --model RUN_DIR``."""
    run_dir = Path(run_dir).expanduser()
    cfg = load_config(run_dir)
    found = latest_weights(run_dir)
    if found is None:
        raise RunDirError(f"{run_dir} has no {ADAPTER_DIR}/{LATEST} yet (written after the first training step); "
                          f"`{_command(command_name(), 'export', str(run_dir))}` makes a model from its last checkpoint")
    path, kind = found
    return (cfg.model.spec, str(path)) if kind == "adapter" else (str(path), None)   # full: a merged model


# --- starting a node in it ----------------------------------------------------------------

def spawn_node(cmd: list[str], run_dir: Path):
    """Start ``ftis-edge start … --headless`` (``cmd`` from child.python_command, the environment
    from child.python_env) for a dashboard: log lines to node.log only, its
    stderr (where a failure is one line) to RUN_DIR/node.stderr (appended),
    returned with the offset this run's part starts at, where its one-line failure will be."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / NODE_STDERR
    with open(path, "ab") as err:
        offset = err.tell()
        proc = subprocess.Popen([*cmd, "--log-file-only"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, env=python_env())
    return proc, (path, offset)


def reset(run_dir: Path) -> None:
    """``--overwrite``: delete everything of a previous run, except the lock this node holds
    (deleting it would let a second node lock a new file beside us)."""
    from .runlock import LOCK_FILE
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prepare_fresh(run_dir: Path) -> None:
    """A new run in ``run_dir``: no checkpoints, adapters, metrics or control state of an
    older one survive (node.log is appended to, so earlier diagnostics stay readable)."""
    run_dir = Path(run_dir)
    checkpoint.clear(run_dir)
    shutil.rmtree(run_dir / ADAPTER_DIR, ignore_errors=True)
    for name in (METRICS_FILE, CONTROL_FILE):
        (run_dir / name).unlink(missing_ok=True)


RECORD_HEADER = """# The settings of the run in this directory, written by the node once its weights loaded.
# `ftis-edge start --run-dir {run} --resume` resumes with this file: edit it to change what may change
# on resume (rounds, eval, threads, learning rate, the task); the model, trainable mode and LoRA
# settings are what the checkpoints were made with, and a resume refuses other values.
"""


def write_record(run_dir: Path, cfg) -> None:
    """RUN_DIR/config.toml: the run's settings (read by ``resume_check``, ``export``, ``eval``)."""
    from dataclasses import replace

    from ..common.atomic import write_text
    from ..config import FILE_PATHS, to_toml
    # absolute paths: a relative one in this file would mean "from this folder" (config.load)
    for section, key in FILE_PATHS:
        part = getattr(cfg, section)
        value = getattr(part, key)
        if value and not Path(value).expanduser().is_absolute():
            cfg = replace(cfg, **{section: replace(part, **{key: os.path.abspath(value)})})
    write_text(Path(run_dir) / CONFIG_FILE, RECORD_HEADER.format(run=run_dir) + to_toml(cfg, comments=False))


def prepare_resume(run_dir: Path) -> None:
    shutil.rmtree(Path(run_dir) / ADAPTER_DIR, ignore_errors=True)


def check_resumable(run_dir: Path, *, fresh_if_missing: bool) -> bool:
    """Whether a ``--resume`` can resume (True) or starts fresh (False, only when allowed).

    Raises CheckpointError in one line when there is nothing to resume and the user did not
    ask for a fresh start instead. Only presence is checked here; ``checkpoint.load_latest``
    verifies contents (and falls back to an older checkpoint)."""
    if checkpoint.complete(run_dir):
        return True
    if fresh_if_missing:
        return False
    why = "the run stopped before its first checkpoint" if (Path(run_dir) / METRICS_FILE).exists() \
        else "no run there yet"
    raise checkpoint.CheckpointError(
        f"--resume: no checkpoint in {checkpoint.dir_of(run_dir)} ({why}); "
        f"use --resume-or-fresh to start fresh when there is none (--overwrite would delete the run)")


def holds_a_run(run_dir: Path, program: str | None = None) -> str:
    """Why a fresh start refuses a run directory that holds a run, with the command that works:
    ``--resume`` when it has a checkpoint, ``--resume-or-fresh`` (which starts it over) when not."""
    program = program or command_name()
    if checkpoint.complete(run_dir):
        keep = f"{_command(program, 'start', '--run-dir', str(run_dir), '--resume')} continues it"
    else:
        keep = (f"it stopped before its first checkpoint, so there is nothing to resume: "
                f"{_command(program, 'start', '--run-dir', str(run_dir), '--resume-or-fresh')} starts it over")
    return (f"{run_dir} already holds a run: {keep}; --run-dir DIR (or another config file name) starts a "
            f"new one beside it; --overwrite DELETES that run and starts over")


def complete_words(run_dir: Path, rounds: int, node_file: str | None = None, program: str | None = None) -> str | None:
    """What a ``--resume`` of a finished run says (before anything loads): that every round the
    settings ask for is done, and how to ask for more; None when there are rounds left."""
    done = checkpoint.complete(run_dir)
    if not done or done[-1] < rounds:
        return None
    program = program or command_name()
    more = str(done[-1] + max(rounds, 1))
    source = ([str(node_file)] if node_file else ["--run-dir", str(run_dir)])
    return (f"{run_dir} is complete: all {rounds} rounds are done (its newest checkpoint is round {done[-1]}); "
            f"nothing was loaded. To train further, ask for more rounds: "
            f"{_command(program, 'start', *source, '--resume', '--rounds', more)} (or set node.rounds in "
            f"{node_file or Path(run_dir) / CONFIG_FILE}); to use it: {_command(program, 'export', str(run_dir))}")


def command_name(argv0: str | None = None) -> str:
    """How the user ran ftis-edge, to print commands they can paste: ``.venv/bin/ftis-edge``
    as typed, ``ftis-edge`` when that is what PATH finds, ``python -m ftis_edge.cli`` for a module run."""
    argv0 = argv0 if argv0 is not None else sys.argv[0]
    name = os.path.basename(argv0)
    if name in ("cli.py", "__main__.py", "-c", ""):
        return "python -m ftis_edge.cli"
    found = shutil.which(name)
    if os.path.isabs(argv0) and found and os.path.realpath(found) == os.path.realpath(argv0):
        return name                         # typed as a bare name, found on PATH
    return argv0


def _command(program: str, *args: str) -> str:
    return " ".join([program, shlex.join(args)])       # the program as the user spells it, unquoted


def stop_summary(run_dir: Path, *, config: str | None = None, exit_code: int | None = None,
                 failure: str | None = None, program: str | None = None, edited: str | None = None) -> str:
    """What the terminal says when the dashboard closes: one line for a failure or a running node, a
    short block for a stop (what ran, best held-out accuracy, the saving, resume, export).
    ``edited``: record_watch.edits_line of RUN/config.toml (an edit made while the node ran).

    It points at ``export`` for the model: ``adapter/latest.gguf`` is a LoRA adapter for a
    LoRA run (llama.cpp refuses it as a model) and a full run's weights live in checkpoints."""
    run_dir = Path(run_dir)
    program = program or command_name()
    records = read_metrics(run_dir)
    # A resumed run's file holds the previous run's stop too: only a stop after the last start counts.
    latest = next((r for r in reversed(records) if r.get("type") in ("start", "stop")), None)
    stop = latest if latest and latest.get("type") == "stop" else None
    rounds = round_records(records)
    last = stop.get("round") if stop else (rounds[-1].get("round") if rounds else 0)
    resume = resume_command(run_dir, program)
    if not failure and isinstance(exit_code, int) and exit_code < 0:
        # killed (kill -9, the OOM killer): it wrote nothing, and a resumed run's stop record is the
        # previous run's, so the exit code is what happened; the last round recorded is where
        done = rounds[-1].get("round") if rounds else 0
        return f"the node was {exit_words(exit_code)} after round {done}" + (f"\n  resume    {resume}" if resume else "")
    if failure or (stop and stop.get("reason") == "error"):
        why = failure or stop.get("error") or "error"
        where = f" — traceback in {run_dir / LOG_FILE}" if has_traceback(run_dir) else ""
        return f"failed after round {last}: {why}{where}" + (f"\n  resume    {resume}" if resume else "")
    if stop is None:
        state = exit_words(exit_code) or "still running"
        line = (f"node {state} after round {last} — run dir {run_dir}, "
                f"watch with: {_command(program, 'watch', str(run_dir))}")
        return line + (f"\n  resume    {resume}" if resume and state != "still running" else "")
    first = next((r for r in reversed(records) if r.get("type") == "start"), {})
    planned = ((first.get("config") or {}).get("node") or {}).get("rounds")
    of = f" of {planned}" if isinstance(planned, int) and stop.get("reason") != "steps" else ""
    rows = [f"stopped after round {last}{of}: {stop_words(stop.get('reason'))}",
            f"  run dir   {run_dir}"]
    held = _best_held_out(records)
    if held:
        rows.append(f"  held-out  {held}")
    saved = _saved(rounds)
    if saved:
        rows.append(f"  saved     {saved}")
    if edited:
        rows.append(f"  config    {edited}")
    relay = first.get("relay")
    if resume:
        rows.append(f"  resume    {resume}" + (f"   (rejoins {relay})" if relay else ""))
    if checkpoint.complete(run_dir):
        rows.append(f"  export    {_command(program, 'export', str(run_dir))}   (GGUF, Ollama, PEFT)")
    found = latest_weights(run_dir)
    if found and found[1] == "adapter":
        rows.append(f"  note      {found[0]} is a LoRA adapter, not a model (llama.cpp --lora)")
    return "\n".join(rows)


STOP_WORDS = {"steps": "all rounds done", "user": "stopped from the dashboard (q, Ctrl-C, or S then y)",
              "signal": "stopped by a signal (Ctrl-C, SIGTERM or a closed terminal)",
              "aborted": "aborted (second Ctrl-C); the round in progress is lost", "error": "failed"}


SHORT_STOP_WORDS = {"steps": "all rounds done", "user": "stopped by you", "signal": "by a signal",
                    "aborted": "aborted", "error": "failed"}


def stop_words(reason, short: bool = False) -> str:
    """A stop record's reason in words ("steps" -> "all rounds done"); ``short`` for a status line."""
    return (SHORT_STOP_WORDS if short else STOP_WORDS).get(reason, str(reason))


def exit_words(code: int | None) -> str | None:
    """How a node process ended, from its exit code, when that is news (None for 0): a negative
    code is the signal that killed it (subprocess's convention); a positive one the node chose
    (130: aborted by a second Ctrl-C, which its stop record says)."""
    import signal
    if not code:
        return None
    if code > 0:
        return f"exited with code {code}"
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    why = {"SIGKILL": " (kill -9, or the system ran out of memory)",
           "SIGSEGV": " (a crash in native code: llama.cpp or torch)"}.get(name, "")
    return f"killed by {name}{why}"


def resume_command(run_dir: Path, program: str | None = None) -> str | None:
    """The command that resumes the run with its recorded settings (RUN_DIR/config.toml), or None
    when it has no checkpoint to resume from."""
    if not checkpoint.complete(run_dir):
        return None
    return _command(program or command_name(), "start", "--run-dir", str(run_dir), "--resume")


def has_traceback(run_dir: Path) -> bool:
    """Whether node.log holds a traceback (a bug's failure); an FtisError's holds only its line."""
    try:
        with open(Path(run_dir) / LOG_FILE, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256_000))
            return b"Traceback (most recent call last)" in fh.read()
    except OSError:
        return False


def _best_held_out(records: list[dict]) -> str | None:
    """The best held-out accuracy of the run by the one rule (best.py), and the last eval's."""
    from ..metrics.best import from_records, too_few, too_few_words
    found = from_records(records)
    evals = [r for r in round_records(records) if isinstance(r.get("eval/accuracy"), (int, float))]
    if found is None or not evals:
        return None
    n = evals[-1].get("eval/n")
    return (f"{found.words()}, {evals[-1]['eval/accuracy']:.0%} at the end"
            + (f"; {too_few_words(n)}" if too_few(n) else ""))


def _saved(rounds: list[dict]) -> str | None:
    """What the swarm saved this run's node, from the newest round that recorded it: the node's
    cumulative ``peers/saved_frac`` (batch fill; absent or null when fill is off)."""
    for rec in reversed(rounds):
        frac = rec.get("peers/saved_frac")
        if isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 <= frac <= 1:
            return (f"{frac:.0%} of your generation: groups peers supplied trained in place of your own "
                    f"(through round {rec.get('round')})")
    return None


def last_error_line(path: Path, offset: int = 0) -> str | None:
    """The one-line error a failed node printed (``ftis-edge: error: …``), or the last line of a
    Python traceback, from its stderr file; None when it printed neither (killed: its notes, such
    as "note: resuming with …", are not why it failed)."""
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
    if "Traceback (most recent call last):" in lines[:-1]:
        return lines[-1]               # a crash before the node's own handler: the exception's line
    return None
