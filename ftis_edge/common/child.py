"""Starting a child Python interpreter without code from the current directory.

``python -c …`` puts ``''`` (the current directory) first on ``sys.path`` and ``python -m …`` puts
the current directory there: a shared run directory holding ``csv.py`` or ``argparse.py`` would
run as soon as a child imports that name. So would an empty entry in ``PYTHONPATH`` (Python reads
``"a:"`` as ``a`` and the current directory). Every child interpreter this project starts (the
grader worker, llama.cpp's converter, the dashboard's node, the demo's relay) is built here:

* Python ≥ 3.11: ``-P`` (nothing unsafe prepended); 3.10: a ``-c`` prelude that drops that first
  entry before anything else is imported (``sys`` is built in, ``runpy`` is found only afterwards).
* ``PYTHONPATH`` is kept (tests and users point it at a source tree), minus its empty entries,
  with this package's own root first when that root is not a site-packages folder, so that the
  child imports the same ftis_edge as its parent whatever its working directory.

``-I`` is not used: it would drop ``PYTHONPATH`` and the user's site-packages too.
"""
from __future__ import annotations

import os
import site
import sys
from pathlib import Path

SAFE_PATH_FLAG = sys.version_info >= (3, 11)          # python -P
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

# 3.10: the first sys.path entry is '' (-c) or the current directory (-m): remove it first.
_DROP_FIRST = "import sys; sys.path.pop(0) if sys.path and sys.path[0] in ('', __import__('os').getcwd()) else None; "


def python_command(*args: str) -> list[str]:
    """``[sys.executable, …]`` for ``-c CODE …`` or ``-m MODULE …`` that never imports from the
    current directory."""
    if len(args) < 2 or args[0] not in ("-c", "-m"):
        raise ValueError("python_command takes '-c CODE …' or '-m MODULE …'")
    if SAFE_PATH_FLAG:
        return [sys.executable, "-P", *args]
    kind, target, rest = args[0], args[1], list(args[2:])
    if kind == "-c":
        return [sys.executable, "-c", _DROP_FIRST + target, *rest]
    code = _DROP_FIRST + f"import runpy; runpy.run_module({target!r}, run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", code, *rest]


def python_env(base: dict | None = None) -> dict:
    """The child's environment: ``base`` (default os.environ) with a PYTHONPATH that names no
    current directory (no empty entries) and starts with this package's root."""
    env = dict(os.environ if base is None else base)
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not _is_site_dir(PACKAGE_ROOT) and PACKAGE_ROOT not in entries:
        entries.insert(0, PACKAGE_ROOT)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _is_site_dir(path: str) -> bool:
    """An installed (not editable) ftis_edge: its root is site-packages, already on the child's
    path after the standard library; putting it in PYTHONPATH would put it before."""
    try:
        dirs = [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:                      # some embedded / virtualenv builds lack these
        dirs = []
    return any(os.path.realpath(path) == os.path.realpath(d) for d in dirs)
