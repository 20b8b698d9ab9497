"""Strings from other machines, made safe to print on a terminal (the relay's copy of the rule
the node uses: ``ftis_edge.common.text_safety`` re-exports it, so there is one rule; the relay imports
nothing of the node).

A peer picks its own node id, topic and key name; printed raw, an ESC sequence in one of them
moves the cursor, rewrites the screen or (OSC 52) writes the operator's clipboard, and a bidi
override makes "evil" read as "live". ``terminal_safe`` turns every such character into
visible text (``\\x1b``, ``\\u202e``): the string stays recognisable and two different ids
stay different. Honest strings come back unchanged.
"""
from __future__ import annotations

import re

# C0 controls (tab and newline too: one field is one line), DEL, C1 controls, and the
# Unicode bidi controls (embeddings, overrides, isolates, marks) and line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(value):
    """``value`` with control and bidi characters written out as escapes (a non-string
    comes back as it is: the wire's own checks judge its type)."""
    if not isinstance(value, str) or not _UNSAFE.search(value):
        return value
    return _UNSAFE.sub(_escape, value)
