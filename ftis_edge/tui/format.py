"""Turning metric values into short strings. Anything missing or malformed renders as "–".

The dashboard reads a file other programs write, so every value is untrusted: a null, a
string where a number belongs, a bool, NaN. These helpers never raise.
"""
from __future__ import annotations

import math

from ftis_edge.common.text_safety import terminal_safe

MISSING = "–"


def as_number(value) -> float | None:
    """A finite int/float as float, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def num(value, digits: int = 3) -> str:
    """Fixed-point number: ``num(0.61234) == "0.612"``."""
    v = as_number(value)
    return MISSING if v is None else f"{v:.{digits}f}"


def pct(value, digits: int = 1) -> str:
    """A fraction as a percentage: ``pct(0.3125) == "31.2%"``."""
    v = as_number(value)
    return MISSING if v is None else f"{100 * v:.{digits}f}%"


def integer(value) -> str:
    """A count: ``integer(1234.0) == "1234"``."""
    v = as_number(value)
    return MISSING if v is None else str(int(round(v)))


def seconds(value) -> str:
    """A duration in seconds: ``seconds(6.04) == "6.0 s"``."""
    v = as_number(value)
    return MISSING if v is None else f"{v:.1f} s"


def age(value) -> str:
    """How long ago, compactly: 4 → "4s", 130 → "2m10s", 7300 → "2h01m"."""
    v = as_number(value)
    if v is None:
        return MISSING
    s = max(0, int(round(v)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def yes_no(value) -> str:
    """A flag: True → "yes", False → "no", anything else → "–"."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return MISSING


def text(value, limit: int = 60) -> str:
    """Any scalar as a short string (dicts and lists are summarised, not dumped)."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else MISSING
    if isinstance(value, (dict, list)):
        value = f"{type(value).__name__} of {len(value)}"
    s = terminal_safe(str(value))      # metrics.jsonl may hold a peer's string from an older node
    return s if len(s) <= limit else s[: limit - 1] + "…"
