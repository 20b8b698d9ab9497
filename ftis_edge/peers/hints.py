"""Hints (issue 66, a pilot; off by default): a peer's verified right answer, cut to its first
half, as the start of this node's own turn on a prompt where none of its own answers was right.
The node then finishes the turn itself and trains on its own continuation with its own log-probs,
in the hinted context (``Round.hinted``); an eval never sees a hint. Text and outcomes cross tokenizers
where token log-probs do not (H6, H7: a Gemma node's held-out accuracy followed its own tokens).

This module is the pure part: which own groups get a hint, from which answer, and what the hint
says. Nothing here generates, trains or keeps time.

**The prefix rule, written down before any measurement (2026-12-07):**

1. Only an answer this node graded right itself (``PeerGroup.rewards``: the intake re-grades
   every peer answer) on a prompt where none of its own answers was right (no signal, and a
   group that was all right needs no hint).
2. The hint is the reasoning before ``<answer>``: the first ``HINT_FRACTION`` of its characters,
   cut back to a word boundary, before ``</think>``, at most ``MAX_HINT_CHARS``. A leading
   ``<think>`` stays (the turn opens as the node's own turns do).
3. The reference answer must not be in it: the hint is cut before the first place the
   reference appears as a number or word of its own, so a one-step solution (``4 × 5 = 20``)
   leaves only the restated question, which is refused by 4.
4. Fewer than ``MIN_HINT_WORDS`` words beyond the question's own: no hint (it would tell
   nothing the question does not).
5. Among a prompt's right answers, the shortest whose hint passes; ties by sender, then hint.

**A hint is a peer's text, judged as one** (``hint_refusal``) before it reaches a prompt: no
control or bidi characters, no link or domain (the reward rule's ``LINK``), no turn markup
(end-of-turn tokens, ``User:``, ``<answer>``). What the node then writes is its own text with
its own log-probs, trained as own samples: text a peer steered, which the plausibility filter
(it judges peer samples) does not see.
"""
from __future__ import annotations

import re
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..common.turns import END_MARKERS
from ..tasks.rewards import LINK

HINT_FRACTION = 0.5      # of the reasoning's characters: BREAD's partial traces, the answer left out
MAX_HINT_CHARS = 400     # a hint is a start, not a solution to copy
MIN_HINT_WORDS = 2       # words beyond the question's own: fewer tells nothing new
RIGHT = 1.0              # reward of a well-formed right answer (rewards.reward_value; partial credit is not right)

_TURN = re.compile(r"(?im)^\s*(user|assistant|system)\s*:|<\|?/?(answer|im_start|im_end|start_of_turn)")
_WORDS = re.compile(r"[^\W_]+", re.UNICODE)


@dataclass(frozen=True)
class Hint:
    prompt_id: str
    text: str          # what opens the node's turn
    peer: str          # the sender of the answer it was cut from


def hint_refusal(text: str) -> str | None:
    """Why a hint may not reach a prompt (None when it may): it is a peer's text."""
    if any(unicodedata.category(ch)[0] == "C" and ch not in "\n\t" for ch in text):
        return "control characters"
    if LINK.search(text):
        return "a link"
    if any(m in text for m in END_MARKERS) or _TURN.search(text):
        return "turn markup"
    return None


def _reasoning(text: str) -> str | None:
    """The part of a completion before its answer, without the closing ``</think>``."""
    cut = text.find("<answer>")
    if cut < 0:
        return None
    body = text[:cut]
    end = body.find("</think>")
    return body if end < 0 else body[:end]


def _mentions(text: str, reference: str) -> int:
    """Where ``reference`` first appears as a token of its own (not inside a longer number or
    word), or -1."""
    ref = reference.strip()
    if not ref:
        return -1
    m = re.search(r"(?<![\w.])" + re.escape(ref) + r"(?![\w]|\.\d)", text)
    return -1 if m is None else m.start()


def hint_prefix(text: str, reference: str, question: str = "") -> str | None:
    """The hint cut from a right answer's ``text`` by the rule above, or None."""
    reasoning = _reasoning(text)
    if reasoning is None:
        return None
    opening = "<think>" if reasoning.lstrip().startswith("<think>") else ""
    body = reasoning.lstrip()[len(opening):]
    limit = min(int(len(body) * HINT_FRACTION), MAX_HINT_CHARS)
    leak = _mentions(body, reference)
    if leak >= 0:
        limit = min(limit, leak)
    prefix = body[:limit]
    if limit < len(body) and not body[limit].isspace() and prefix and not prefix[-1].isspace():
        whole = re.match(r"(?s)(.*\s)\S*$", prefix)          # the words that ended before the cut
        prefix = whole.group(1) if whole else ""
    prefix = prefix.rstrip()
    asked = {w.lower() for w in _WORDS.findall(question)}
    new_words = [w for w in _WORDS.findall(prefix) if w.lower() not in asked]
    if len(new_words) < MIN_HINT_WORDS:
        return None
    hint = opening + prefix
    return None if hint_refusal(hint) else hint


def open_turn(rendered: str, hint: str) -> str:
    """The rendered prompt with ``hint`` opening the model's turn: after a chat template's
    generation prompt as it stands, after the plain format's ``Assistant:`` with the space the
    model writes there itself."""
    return rendered + (" " if rendered.endswith(":") else "") + hint


MAX_PROMPTS = 1024       # prompts a HintBook remembers a hint for (least recently added forgotten first)


class HintBook:
    """Run-long, bounded: the best hint (rule 5) seen for each prompt, from the peer groups intake
    accepted (graded here). ``remember`` once per arrival, ``for_group`` for each own group (rule
    1). A hint is kept only once it passed ``hint_prefix`` and ``hint_refusal``; quarantined
    peers' groups never reach it (intake drops them first)."""

    def __init__(self, max_prompts: int = MAX_PROMPTS):
        self.max_prompts = max_prompts
        self._best: OrderedDict[str, tuple[tuple, Hint]] = OrderedDict()

    def remember(self, groups: Iterable) -> None:
        for g in groups:
            prompt = g.prompt
            pid = str(prompt.id)
            for c, r in zip(g.rollout.completions, g.rewards):
                if r < RIGHT:
                    continue
                hint = hint_prefix(c.text, str(prompt.reference), prompt.question)
                if hint is None:
                    continue
                peer = str(g.rollout.node_id)
                key = (len(c.text), peer, hint)
                if pid not in self._best or key < self._best[pid][0]:
                    self._best[pid] = (key, Hint(pid, hint, peer))
                    self._best.move_to_end(pid)
        while len(self._best) > self.max_prompts:
            self._best.popitem(last=False)

    def hint_for(self, prompt) -> Hint | None:
        found = self._best.get(str(prompt.id))
        return None if found is None else found[1]

    def for_group(self, prompt, rewards: Sequence[float]) -> Hint | None:
        """The hint for an own group on ``prompt`` with these rewards: none when one of its
        answers was right (rule 1: a right answer of its own needs no hint)."""
        return None if any(r >= RIGHT for r in rewards) else self.hint_for(prompt)

    def __len__(self) -> int:
        return len(self._best)

    # --- checkpoint -------------------------------------------------------------------------
    def state(self) -> dict:
        return {"hints": [[h.prompt_id, h.text, h.peer, key[0]] for key, h in self._best.values()]}

    def load_state(self, state: dict | None) -> None:
        """Restore what ``state`` wrote; each hint is judged again (a checkpoint is disk, not trust)."""
        if not state:
            return
        try:
            rows = [(str(pid), str(text), str(peer), int(length)) for pid, text, peer, length in state["hints"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"hint book in the checkpoint does not read: {e!r}") from None
        self._best = OrderedDict()
        for pid, text, peer, length in rows[-self.max_prompts:]:
            if hint_refusal(text) is None:
                self._best[pid] = ((length, peer, text), Hint(pid, text, peer))
