"""When a sampled sequence ends: an end-of-generation token, or the text of the next turn.

A chat model closes its turn with an EOS token. A base model prompted in the plain format
(``System: … User: … Assistant:``, models.py) has no such token: once it has answered it
writes the next ``User:`` turn itself, and a grader then sees text after ``</answer>``. So a
stop text ends the sequence the moment the decoded tail contains it. Like an EOS token, the
tokens that spelled it stay in the completion (sampled, with their log-probs: they teach the
policy to end its turn), and the reward rule strips the marker from the end of the text.
"""
from __future__ import annotations

from typing import Sequence


class StopRule:
    """``ends(tokens)``: does the last sampled token end the sequence?"""

    def __init__(self, eos_token_ids: Sequence[int], texts: Sequence[str] = (), token_bytes=None):
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.texts = [t.encode("utf-8") for t in texts if t]
        if self.texts and token_bytes is None:
            raise ValueError("stop texts need the tokenizer's token bytes (align.TokenBytes)")
        self._table = token_bytes.table if self.texts else None
        self._longest = max((len(t) for t in self.texts), default=0)

    def ends(self, tokens: Sequence[int]) -> bool:
        if tokens[-1] in self.eos:
            return True
        if not self.texts:
            return False
        # the bytes of the last few tokens, just enough to hold a stop text that ends in the
        # last one (an earlier occurrence would have stopped the sequence already)
        table, n = self._table, len(self._table)
        piece = lambda t: table[t] if 0 <= t < n else b""     # ids past the tokenizer: padding rows
        tail, need, i = b"", self._longest + len(piece(tokens[-1])), len(tokens)
        while i and len(tail) < need:
            i -= 1
            tail = piece(tokens[i]) + tail
        return any(t in tail for t in self.texts)
