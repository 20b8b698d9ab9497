"""The re-grading scheduler, pure: who is graded next within a round's time budget.

The reward of a peer's answers is recomputed locally within a total time budget a round, shared
across senders one turn at a time. In front: known peers whose groups carried signal together
with never-graded ids until those have spent ``NEWCOMER_SHARE`` of the budget; then the other
never-graded ids, known peers whose groups never did, and last those known to grade slowly or
to make the grader overrun (``grading_class``). Within a class everyone's first turn before
anyone's second, the one waiting longest first (since last graded, or first seen), then a
rotating order (``grading_key``). A turn lasts at least what its whole groups of fast answers
cost (within ``GROUP_SLICE`` of the budget), so neither many ids (1,000 with cheap answers) nor
ids whose answers grade just under the limit can keep an honest peer's group ungraded.

``GradingRound`` holds that bookkeeping with the clock and the answers' counts and sizes handed
in: it never grades and never calls back; ``Intake`` asks it for the next turn, grades, and
says what the turn used. So the policy replays on a made-up clock (tests/test_grading.py).
"""
from __future__ import annotations

import dataclasses
import heapq
import random
from dataclasses import dataclass, field

EXPENSIVE = 0.25      # of the per-answer timeout: a sender whose answers took this long on average
NEWCOMER_SHARE = 0.2   # of the round's budget: what never-graded ids may spend ahead of known useful peers
GROUP_SLICE = 0.2      # of the round's budget: the most one rollout's slice is stretched to
SIZE_BUCKET = 8        # answer characters: shorter answers first only between buckets (cheap
#                        answers all look alike; the bucket keeps slow long ones behind them)

# grading classes, served in this order (``grading_class``)
FRONT, NEWCOMER, KNOWN, SLOW, OVERRAN = range(5)


def grading_tier(grade_s: float | None, timeout_s: float, slow: bool) -> int:
    """0: answers known to grade fast; 1: not known yet; 2: known to grade slowly (just under
    the time limit); 3: made the grader overrun."""
    if slow:
        return 3
    if grade_s is None:
        return 1
    return 0 if grade_s < EXPENSIVE * timeout_s else 2


def grading_class(standing: Standing, timeout_s: float, newcomers_may: bool) -> int:
    """Where a sender's next rollout stands in the round's grading (lower first): in front, a
    fast peer whose recent groups carried signal, and a never-graded id while the round's
    newcomers have spent less than ``NEWCOMER_SHARE`` of the budget (``newcomers_may``); then
    other never-graded ids; a fast peer whose groups never did; one whose answers grade
    slowly; one that made the grader overrun. So a crowd of new ids cannot push known useful
    peers out, and a crowd of known ids cannot keep a new one out."""
    tier = grading_tier(standing.grade_s, timeout_s, standing.slow)
    if tier == 1:
        return FRONT if newcomers_may else NEWCOMER
    if tier == 0:
        return FRONT if standing.useful else KNOWN
    return SLOW if tier == 2 else OVERRAN


def grading_key(sender: str, cls: int, turns: int, waiting_since: int, size: int, rotation: float) -> tuple:
    """Where a sender's next rollout is graded (lowest first): by class (``grading_class``),
    then turns this round (everyone's first turn before anyone's second), then the one
    waiting longest (since the round it was last graded, or first seen: ids share a short
    budget round by round, and a new id queues behind those already waiting), then shorter answers by
    ``SIZE_BUCKET`` (a prior for unknown senders: a slow answer is rarely short), then a
    rotating order that the sender cannot choose. So many ids, or ids whose answers grade
    just under the time limit, spend their own share, never an honest peer's."""
    return (cls, turns, waiting_since, size // SIZE_BUCKET, rotation, sender)


@dataclass
class Standing:
    """What the node knew of a sender when the round began (its book entry, read once)."""
    grade_s: float | None = None     # grading seconds per answer (None: never graded)
    useful: bool = False             # one of its recent accepted groups carried signal
    slow: bool = False               # its answers made the grader overrun
    waiting_since: int = -1          # the round it was last graded, else first seen


@dataclass
class Turn:
    """One sender's turn: grade its ``items`` in order while the clock is before ``until``."""
    sender: str
    items: list
    until: float
    start: float
    was_new: bool                    # never graded at its start: counts towards the newcomers' share


@dataclass
class _Sender:
    standing: Standing
    items: list                      # its waiting rollouts (opaque to the scheduler), in arrival order
    answers: list                    # answers in each
    size: int                        # its longest answer's length (a prior for the cost)
    rotation: float
    turns: int = 0
    key: tuple = field(default=())


class GradingRound:
    """The turns of one round, on a clock the caller reads: ``next(now)`` gives the next turn
    (None once the budget is spent or no one waits), ``done(turn, now, ...)`` takes what it
    used and what was learned of its sender. Keys only grow (turns, class, last graded round),
    so a heap with stale entries re-pushed when popped gives the order without re-ranking
    every sender each turn."""

    def __init__(self, budget_s: float, timeout_s: float, now: float, current_round: int,
                 rotation: random.Random):
        if not budget_s > 0 or not timeout_s > 0:
            raise ValueError("GradingRound: budget_s and timeout_s must be > 0")
        self.budget_s, self.timeout_s, self.round = budget_s, timeout_s, current_round
        self.deadline = now + budget_s
        self.newcomer_spent = 0.0
        self.turned: list[str] = []      # senders in the order their turns came
        self._rotation = rotation
        self._senders: dict[str, _Sender] = {}
        self._heap: list[tuple] = []

    def add(self, sender: str, standing: Standing, items: list, answers: list[int], size: int) -> None:
        """A sender's waiting rollouts (``items``, with ``answers`` answers each), all at once."""
        if sender in self._senders or len(items) != len(answers) or not items:
            raise ValueError(f"GradingRound.add: {sender!r} twice, or items and answers differ")
        s = _Sender(dataclasses.replace(standing), list(items), list(answers), size, self._rotation.random())
        self._senders[sender] = s
        s.key = self._key(sender, s)
        heapq.heappush(self._heap, s.key)

    def _key(self, sender: str, s: _Sender) -> tuple:
        cls = grading_class(s.standing, self.timeout_s, self.newcomer_spent < NEWCOMER_SHARE * self.budget_s)
        return grading_key(sender, cls, s.turns, s.standing.waiting_since, s.size, s.rotation)

    def next(self, now: float) -> Turn | None:
        while self._heap:
            left = self.deadline - now
            if left <= 0:
                return None
            entry = heapq.heappop(self._heap)
            sender = entry[-1]
            s = self._senders[sender]
            fresh = self._key(sender, s)
            if fresh != entry:               # its class moved since it was pushed
                heapq.heappush(self._heap, fresh)
                continue
            # one turn: its waiting rollouts, for at least what whole groups of fast answers
            # cost (within GROUP_SLICE of the budget), else an equal share of what is left:
            # ids take turns round by round rather than splitting one round into crumbs
            whole = min(sum(s.answers) * EXPENSIVE * self.timeout_s, GROUP_SLICE * self.budget_s)
            until = min(now + max(left / (len(self._heap) + 1), whole), self.deadline)
            was_new = s.standing.grade_s is None and not s.standing.slow
            return Turn(sender, list(s.items), until, now, was_new)
        return None

    def done(self, turn: Turn, now: float, used: int, grade_s: float | None = None,
             overran: bool = False) -> None:
        """``used``: how many of its items the turn graded (from the front); ``grade_s``: what its
        answers cost per answer now (None: unchanged); ``overran``: an answer made the grader
        overrun (it goes last from now on)."""
        s = self._senders[turn.sender]
        if not 0 <= used <= len(s.items):
            raise ValueError(f"GradingRound.done: used {used} of {len(s.items)} items")
        del s.items[:used], s.answers[:used]
        if turn.was_new:
            self.newcomer_spent += now - turn.start
        if grade_s is not None:
            s.standing.grade_s = grade_s
        s.standing.slow = s.standing.slow or overran
        s.standing.waiting_since = self.round
        s.turns += 1
        self.turned.append(turn.sender)
        if s.items:
            s.key = self._key(turn.sender, s)
            heapq.heappush(self._heap, s.key)
