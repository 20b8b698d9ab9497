"""Strings from other machines and from disk, made safe to print.

A peer picks its own node id, model name and fingerprints; a shared run directory names its
model folder; a GGUF file carries its own ``general.name``. Printed raw, an ESC sequence in one
of them moves the cursor, clears the screen or (OSC 52) writes the user's clipboard, a bidi
override makes "evil" read as "live", and Rich markup (``[link=…]``) becomes a live hyperlink on
any console that renders markup (progress lines, tables, the dashboard's toasts).

``shown`` is the one sanitiser for every string that comes from disk, a peer or a model file,
before any console, log or card: it turns every control and bidi character into visible text
(``\\x1b``, ``\\u202e``: ``terminal_safe``, the relay's rule too), and with ``markup=True`` — for
a destination that renders Rich markup (a Rich console line or table, the dashboard's toasts) —
also escapes markup tags (``\\[link=…]``). Plain text (print, node.log, the model card) keeps its
brackets: ``[task]`` in a message is no tag there. Either way the string stays recognisable, two
different ones stay different, and honest strings come back unchanged.
"""
from __future__ import annotations

import re

from relay.text_safety import terminal_safe  # noqa: F401 - one rule for the node and the relay

# rich.markup.escape's pattern: a tag opens with [ and a letter, #, / or @ (``[bold]``, ``[/]``,
# ``[link=…]``, ``[@click=…]``); backslashes before it are doubled so none can undo the escape.
_MARKUP = re.compile(r"(\\*)(\[[a-zA-Z#/@][^[]*?])")


def shown(value, *, markup: bool = False) -> str:
    """``value`` as text that prints inert: control and bidi characters written out; with
    ``markup``, Rich markup tags escaped too (for a destination that renders markup)."""
    text = terminal_safe(value if isinstance(value, str) else str(value))
    if not markup:
        return text
    return _MARKUP.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", text)


__all__ = ["shown", "terminal_safe"]
