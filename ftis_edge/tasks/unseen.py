"""Held-out means unseen: an eval question's *text* never reaches training.

Ids alone do not hold prompts apart. arith's level 1 has 162 distinct questions, so an eval
id drawn above 10^9 almost always has a twin with the same text under a training id (28 of the
29 distinct questions of the old in-run eval did); a JSON Lines file or a dataset may repeat a
question across its splits; a procedural generator may draw the same item twice. Two rules
close that, by the question's text (whitespace collapsed, case folded):

* a task with an endless generator (arith) splits its *text space*: a question is held out when
  a hash of its text says so (``held_out_by_text``), so the split is a property of the task alone,
  the same on every machine and whatever eval size a node picks;
* a task with a fixed eval split (datasets, JSON Lines, reasoning-gym) takes out of training every
  item whose text is also an eval item's (``EvalTexts``).

Either way ``Task.is_trainable`` refuses such a text under any id, so a peer cannot make a node
train on its held-out questions under another name.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Iterable

# A quarter of an endless task's question texts are held out: arith's smallest level keeps
# ~40 distinct eval questions and ~120 to train on; larger levels lose nothing that matters.
HELD_OUT_SHARE = 0.25
# Draws without a new held-out text before a small text space counts as exhausted (level 1's
# rarest question has p = 1/243 a draw: missing it 2,000 times has p ≈ 3e-4).
PATIENCE = 2000


def question_key(text: str) -> str:
    """The text that decides 'the same question': whitespace collapsed, case folded."""
    return " ".join(str(text).split()).casefold()


def held_out_by_text(text: str, salt: str, share: float = HELD_OUT_SHARE) -> bool:
    """Does this question belong to the held-out part of the task's text space?"""
    digest = hashlib.sha256(f"{salt}\n{question_key(text)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2 ** 64


def distinct_held_out(draw: Callable[[int], object], text_of: Callable[[object], str], salt: str,
                      patience: int = PATIENCE) -> Iterable:
    """Items ``draw(0), draw(1), …`` whose text is held out, each text once; ends when
    ``patience`` draws in a row bring no new held-out text (a small space is exhausted)."""
    seen: set[str] = set()
    j = misses = 0
    while misses < patience:
        item = draw(j)
        j += 1
        key = question_key(text_of(item))
        if key in seen or not held_out_by_text(key, salt):
            misses += 1
            continue
        seen.add(key)
        misses = 0
        yield item


class EvalTexts:
    """The texts of a fixed eval split, loaded on first use: training skips them."""

    def __init__(self, load: Callable[[], Iterable[str]]):
        self._load, self._keys = load, None

    @property
    def keys(self) -> frozenset:
        if self._keys is None:
            self._keys = frozenset(question_key(t) for t in self._load())
        return self._keys

    def __contains__(self, text: str) -> bool:
        return question_key(text) in self.keys
