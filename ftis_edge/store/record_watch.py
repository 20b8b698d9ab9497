"""RUN/config.toml edited while its node runs: said when it happens, never applied silently.

A node reads its settings once, when it starts; the run's record (``config.toml``) is what a
``--resume`` without a node file starts from (resume_check.py). An edit made while the node runs
therefore changes nothing until then — which a user cannot guess. ``edits`` compares the file
with the settings the node started with (its last start record); ``RecordWatch`` notices the
file change (its size and mtime, one stat a call) and says each new state of the edits once:
the node's log, the dashboard and the stop summary all use ``edits_line``.
"""
from __future__ import annotations

import os
from pathlib import Path

CONFIG_FILE = "config.toml"          # rundir.CONFIG_FILE (rundir imports this module's users)


def edits(run_dir: Path) -> list[str] | None:
    """"key: old → new" for each setting RUN/config.toml now has that differs from the node's
    last start ([] when none; None when there is no start record or file to compare).
    A file that no longer loads is one line saying why."""
    from ..config import ConfigError, load
    from .resume_check import change_line, differences, recorded_settings, _flat
    run_dir = Path(run_dir)
    started = recorded_settings(run_dir)
    path = run_dir / CONFIG_FILE
    if started is None or not path.is_file():
        return None
    try:
        now = _flat(load(path).to_dict())
    except ConfigError as e:
        return [f"it no longer loads ({e})"]
    return [change_line(*d) for d in differences(started, now)]


def edits_line(run_dir: Path, *, running: bool = True, program: str = "ftis-edge") -> str | None:
    """One line for the edits of RUN/config.toml since the node started, or None without any."""
    found = edits(run_dir)
    if not found:
        return None
    path = Path(run_dir) / CONFIG_FILE
    if not running:            # the stop summary: its resume row follows
        return f"{path} was edited while the node ran ({'; '.join(found)}): not used yet, it applies on resume"
    return (f"{path} changed while the node runs ({'; '.join(found)}): a node reads it when it starts, so this "
            f"run goes on with its settings; the edit applies when you resume it: "
            f"{program} start --run-dir {run_dir} --resume")


def _stamp(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class RecordWatch:
    """Notices edits of RUN/config.toml: ``news()`` returns ``edits_line`` when the file changed
    and what it says is new (each state once; an edit undone is said too), else None."""

    def __init__(self, run_dir: Path, program: str = "ftis-edge"):
        self.run_dir, self.program = Path(run_dir), program
        self.path = self.run_dir / CONFIG_FILE
        self._stamp = _stamp(self.path)
        self._said: str | None = None

    def news(self) -> str | None:
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        line = edits_line(self.run_dir, program=self.program)
        if line == self._said:
            return None
        before, self._said = self._said, line
        if line is None:           # edited back to what the node runs with
            return f"{self.path} again matches the settings this node runs with" if before else None
        return line
