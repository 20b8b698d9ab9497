"""Strings from other machines, made safe to print on a terminal.

A peer picks its own node id, model name and fingerprints; printed raw, an ESC sequence in
one of them moves the cursor, rewrites the screen or (OSC 52) writes the user's clipboard,
and a bidi override makes "evil" read as "live". ``terminal_safe`` turns every such
character into visible text (``\\x1b``, ``\\u202e``): the string stays recognisable and two
different ids stay different. Honest strings come back unchanged.
"""
from __future__ import annotations

from relay.text_safety import terminal_safe  # noqa: F401 - one rule for the node and the relay

__all__ = ["terminal_safe"]
