"""Which strings can name a task, checked without importing a task (no grader, no dataset).

Config validation and ``ftis-edge eval --help`` ask this; ``tasks/registry.py`` turns a name
into a task class. The forms are listed in the registry's docstring.
"""
from __future__ import annotations

import re
from importlib.metadata import entry_points

BUILTIN = ("arith", "gsm8k", "math500", "reasoning_gym", "jsonl")
ENTRY_POINT_GROUP = "ftis_edge.tasks"
DOTTED = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def entry_point(name: str):
    """The installed ``ftis_edge.tasks`` entry point called ``name``, or None."""
    return next(iter(entry_points(group=ENTRY_POINT_GROUP, name=name)), None)


def name_problem(name) -> str | None:
    """Why ``name`` cannot name a task (syntax only: nothing is imported), or None."""
    if not isinstance(name, str) or not name:
        return "task name must be a non-empty string"
    if name in BUILTIN or name.startswith("reasoning_gym:") or name.startswith("{") or DOTTED.fullmatch(name):
        return None
    if entry_point(name) is not None:
        return None
    return (f"unknown task {name!r}; choose one of {', '.join(BUILTIN)}, "
            f"reasoning_gym:<dataset>,…, a class path module:Class, or an installed '{ENTRY_POINT_GROUP}' entry point")
