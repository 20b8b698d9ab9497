"""Starting a child Python interpreter without code from the current directory.

``python -c …`` puts ``''`` (the current directory) first on ``sys.path`` and ``python -m …`` puts
the current directory there: a shared run directory holding ``csv.py`` or ``argparse.py`` would
run as soon as a child imports that name. So would an empty entry in ``PYTHONPATH`` (Python reads
``"a:"`` as ``a`` and the current directory). Every child interpreter this project starts (the
grader worker, llama.cpp's converter, the dashboard's node, the demo's relay) is built here:

* Python ≥ 3.11: ``-P`` (nothing unsafe prepended); 3.10: a ``-c`` prelude that drops that first
  entry before anything else is imported (``sys`` is built in, ``runpy`` is found only afterwards).
* ``PYTHONPATH`` is kept (tests and users point it at a source tree), minus every entry that
  names the current directory in any spelling: empty ones, ``.``, any relative one (it is read
  against the child's working directory) and the working directory's own path (issue 62.7:
  ``.`` was kept).
* This package's own root (when it is not a site-packages folder, so that the child imports
  the same ftis_edge as its parent whatever its working directory) goes on the path by the
  prelude, after the standard library and before site-packages: on ``PYTHONPATH`` it stood
  before the standard library, and a ``sitecustomize.py`` or a stdlib-named file beside the
  checkout ran in every child (issue 62.7). ``-m MODULE`` is run by ``runpy`` after it.

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


def _root_prelude() -> str:
    """Code that puts this package's root on the path after the standard library (before the
    first site-packages folder), so a file there never stands in for a standard module."""
    if _is_site_dir(PACKAGE_ROOT):
        return ""
    return ("import sys; _i = next((k for k, p in enumerate(sys.path) if p.endswith(('site-packages', "
            f"'dist-packages'))), len(sys.path)); {PACKAGE_ROOT!r} in sys.path or sys.path.insert(_i, "
            f"{PACKAGE_ROOT!r}); del _i; ")


def python_command(*args: str) -> list[str]:
    """``[sys.executable, …]`` for ``-c CODE …`` or ``-m MODULE …`` that never imports from the
    current directory, with this package's root after the standard library."""
    if len(args) < 2 or args[0] not in ("-c", "-m"):
        raise ValueError("python_command takes '-c CODE …' or '-m MODULE …'")
    kind, target, rest = args[0], args[1], list(args[2:])
    prelude = ("" if SAFE_PATH_FLAG else _DROP_FIRST) + _root_prelude()
    flags = ["-P"] if SAFE_PATH_FLAG else []
    if kind == "-c":
        return [sys.executable, *flags, "-c", prelude + target, *rest]
    code = prelude + f"import runpy; runpy.run_module({target!r}, run_name='__main__', alter_sys=True)"
    return [sys.executable, *flags, "-c", code, *rest]


def python_env(base: dict | None = None, cwd: str | None = None) -> dict:
    """The child's environment: ``base`` (default os.environ) with a PYTHONPATH that names no
    current directory (``cwd``, default this process's: the child's unless it is given another)."""
    env = dict(os.environ if base is None else base)
    here = os.path.realpath(cwd or os.getcwd())
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
               if p and os.path.isabs(p) and os.path.realpath(p) != here]
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
