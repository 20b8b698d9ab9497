"""The package's error base class: every problem a user can cause or fix derives from it.

``ftis-edge`` prints an ``FtisError`` as one line and exits 2; anything else is a bug or an
environment failure, printed as one line with the traceback in the run's node.log. Modules
keep their own subclasses (``ConfigError``, ``ModelError``, ``TaskError``, ``CheckpointError``
...) so callers can catch narrowly; most also derive from ``ValueError`` as they always did.
"""
from __future__ import annotations


class FtisError(Exception):
    """A problem with the user's input or setup, described in one readable line."""


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception as one line: its message (type name first unless it is an FtisError)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, FtisError) and not text.startswith(type(exc).__name__):
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
