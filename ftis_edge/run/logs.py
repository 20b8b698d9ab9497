"""Logging of a node: every ``ftis_edge.*`` logger into RUN_DIR/node.log (and the console
when headless); third-party start-up noise silenced.

Modules log through ``logging.getLogger(__name__)``, so their lines land here by name.
A record logged with ``extra={"console": False}`` goes to node.log only (the CLI prints the
one-line form of a failure itself); tracebacks never reach the console, only node.log.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path

from ..common.text_safety import terminal_safe
from ..metrics.compute import saved_phrase
from ..metrics.records import LOG_FILE

ROOT = "ftis_edge"
FORMAT = "%(asctime)s %(levelname)s %(message)s"


class _SafeFormatter(logging.Formatter):
    """The values logged (``%s`` arguments: a model folder's name, a peer's id, a GGUF's
    general.name) with control and bidi characters written out: the log is read on terminals."""

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.args, tuple) and any(isinstance(a, str) for a in record.args):
            record = logging.makeLogRecord({**record.__dict__, "args": tuple(
                terminal_safe(a) if isinstance(a, str) else a for a in record.args)})
        return super().format(record)


class _ConsoleFormatter(_SafeFormatter):
    """One line per record on the console: the traceback stays in node.log."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text:
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)


def _console_wanted(record: logging.LogRecord) -> bool:
    return getattr(record, "console", True)


def setup_logging(run_dir: Path, *, console: bool) -> None:
    """node.log (and the console) for every ``ftis_edge.*`` logger and for the relay client
    under ``ftis_edge.peers.swarm`` (``relay.*``: it lives beside the package, not in it)."""
    fh = logging.FileHandler(Path(run_dir) / LOG_FILE, encoding="utf-8")
    fh.setFormatter(_SafeFormatter(FORMAT, "%H:%M:%S"))
    handlers: list[logging.Handler] = [fh]
    if console:
        sh = logging.StreamHandler()
        sh.setFormatter(_ConsoleFormatter(FORMAT, "%H:%M:%S"))
        sh.addFilter(_console_wanted)
        handlers.append(sh)
    for name in (ROOT, "relay"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
        for h in handlers:
            logger.addHandler(h)


def quiet_third_party() -> None:
    """Silence start-up noise a user cannot act on: transformers' "Loading weights" and GGUF
    conversion progress bars (tqdm), its info/warning chatter, and deprecation FutureWarnings
    raised inside transformers/peft (e.g. ``is_gradient_checkpointing``). Call it before torch
    is imported for the tqdm part (``ftis-edge start`` does)."""
    os.environ.setdefault("TQDM_DISABLE", "1")    # read when tqdm is imported (torch imports it)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for module in ("transformers", "peft", "huggingface_hub", "torch"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=rf"{module}(\.|$)")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars
        disable_progress_bars()
    except ImportError:
        pass


def _num(value, spec: str) -> str:
    return "–" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, spec)


def round_line(record: dict, *, swarm: bool) -> str:
    """The headless log line of one round (metric names: docs/metrics.md).

    round 3: reward 0.375 (peers 0.500), accuracy 25%, loss 0.0123, dropped 2, 412 tok/s,
    peer groups 4 received / 2 used / 1 dropped, swarm supplied 3 of 4 groups; 58% of your
    generation saved so far, 8.1 s
    round 4: reward 0.000, accuracy 0%, no optimiser step (all 4 groups had equal rewards), ...
    """
    parts = [f"round {record.get('round')}: reward {_num(record.get('reward/own'), '.3f')}"
             + (f" (peers {_num(record['reward/peers'], '.3f')})" if record.get("reward/peers") is not None else ""),
             f"accuracy {_num(100 * record['accuracy/own'] if isinstance(record.get('accuracy/own'), (int, float)) else None, '.0f')}%"]
    if record.get("skipped"):
        why = ("every group had equal rewards" if record.get("frac_reward_zero_std") == 1
               else "no sample carried a signal")
        parts.append(f"no optimiser step ({why})")
    else:
        parts.append(f"loss {_num(record.get('loss'), '.4f')}, dropped {_num(record.get('filter/dropped', 0), '.0f')}")
    parts.append(f"{_num(record.get('gen/tok_s'), '.0f')} tok/s")
    if swarm:
        dropped = (record.get("peers/rejected") or 0) + (record.get("peers/stale") or 0)
        parts.append(f"peer groups {_num(record.get('peers/groups_received', 0), '.0f')} received / "
                     f"{_num(record.get('peers/groups_used', 0), '.0f')} used / {_num(dropped, '.0f')} dropped")
        saved = saved_phrase(record)
        if saved:
            parts.append(saved)
    parts.append(f"{_num(record.get('time/round_s'), '.1f')} s")
    return ", ".join(parts)


@contextlib.contextmanager
def output_to(path: Path):
    """Everything written to stdout/stderr inside the block, C libraries included (llama.cpp's
    loader and quantizer print from C), goes to ``path`` (appended) instead of the terminal."""
    import sys
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as fh:
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
            try:
                yield                                   # warnings are written to stderr: the file too
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
