"""The re-grading scheduler, pure: who is graded next within a round's time budget.

The reward of a peer's answers is recomputed locally within a total time budget a round, shared
across senders one turn at a time. First never-graded ids (or ones the book evicted) until they
have spent their share of the budget (``newcomer_share``: ``NEWCOMER_SHARE`` beside a few known
useful peers, growing with the newcomers' head count once those are a crowd); then known peers whose groups carried signal; the
other never-graded ids; known peers whose groups never did; and last those known to grade
slowly or to make the grader overrun (``grading_class``). Within a class everyone's first turn
before anyone's second, shorter answers by bucket, then the ring (``grading_key``,
``GradingRing``): each class's round-robin goes on where it stopped last round, at places no id
can choose, so every id gets its turn once a cycle whatever the arrival order and however often
the 512-entry book evicted it, with one integer of memory a round-robin. A turn lasts at least
what its whole groups of fast answers cost (within ``GROUP_SLICE`` of the budget), so neither
many ids (10,000 with cheap answers) nor ids whose answers grade just under the limit can keep
an honest peer's group ungraded, a crowd of new ids cannot push known useful peers out (it has
its share), and a crowd of known ids cannot keep a new one out (the share comes first).

``GradingRound`` holds one round's bookkeeping with the clock and the answers' counts and sizes
handed in: it never grades and never calls back; ``Intake`` asks it for the next turn, grades,
and says what the turn used. So the policy replays on a made-up clock (tests/test_grading.py,
benchmarks/attacks/grading_sybils_clock.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import os
from dataclasses import dataclass

EXPENSIVE = 0.25      # of the per-answer timeout: a sender whose answers took this long on average
NEWCOMER_SHARE = 0.2   # of the round's budget: what never-graded ids may spend ahead of known useful peers
FRONT_CROWD = 64       # known useful ids waiting: from this many on they are a crowd, not a few trusted peers
GROUP_SLICE = 0.2      # of the round's budget: the most one rollout's slice is stretched to
SIZE_BUCKET = 8        # answer characters: shorter answers first only between buckets (cheap
#                        answers all look alike; the bucket keeps slow long ones behind them)

MAX_BUCKET = 63       # size buckets beyond it are one (a cursor each: bounded memory)
RING = 1 << 64        # positions on the ring of ids (``GradingRing``)

# grading classes, served in this order (``grading_class``)
SHARE, FRONT, NEWCOMER, KNOWN, SLOW, OVERRAN = range(6)


def grading_tier(grade_s: float | None, timeout_s: float, slow: bool) -> int:
    """0: answers known to grade fast; 1: not known yet; 2: known to grade slowly (just under
    the time limit); 3: made the grader overrun."""
    if slow:
        return 3
    if grade_s is None:
        return 1
    return 0 if grade_s < EXPENSIVE * timeout_s else 2


def newcomer_share(new_ids: int, front_ids: int) -> float:
    """The budget's share never-graded ids may spend first, given how many of them and how many
    known useful ids wait this round. A few known useful peers keep the rest (the newcomers get
    ``NEWCOMER_SHARE``); a crowd of them (``FRONT_CROWD`` and more: Sybil ids that sent a few
    useful groups, the book keeping 512 of them and evicting the rest back into the newcomers)
    is no more trusted than the newcomers, so the share grows towards the newcomers' head count
    and each waiting id, known or new, comes round about as often (issue 62 item 3: an honest
    new peer among 2,000 such ids was graded in 0 of 3 runs of 100 rounds). Smooth in both
    counts, so no id count is a cliff."""
    if new_ids <= 0:
        return NEWCOMER_SHARE
    crowd = min(1.0, front_ids / FRONT_CROWD)
    return max(NEWCOMER_SHARE, crowd * new_ids / (new_ids + front_ids))


def grading_class(standing: Standing, timeout_s: float, newcomers_may: bool) -> int:
    """Where a sender's next rollout stands in the round's grading (lower first): first a
    never-graded id while the round's newcomers have spent less than their share of the
    budget (``newcomer_share``; ``newcomers_may``); then a fast peer whose recent groups carried signal; other
    never-graded ids; a fast peer whose groups never did; one whose answers grade slowly; one
    that made the grader overrun. So a crowd of new ids cannot push known useful peers out (it
    has its share), and a crowd of known ids cannot keep a new one out (the share comes first)."""
    tier = grading_tier(standing.grade_s, timeout_s, standing.slow)
    if tier == 1:
        return SHARE if newcomers_may else NEWCOMER
    if tier == 0:
        return FRONT if standing.useful else KNOWN
    return SLOW if tier == 2 else OVERRAN


def size_bucket(size: int) -> int:
    return min(size // SIZE_BUCKET, MAX_BUCKET)


def grading_key(sender: str, cls: int, turns: int, size: int, distance: int) -> tuple:
    """Where a sender's next rollout is graded (lowest first): by class (``grading_class``),
    then turns this round (everyone's first turn before anyone's second), then shorter answers
    by ``SIZE_BUCKET`` (a prior for unknown senders: a slow answer is rarely short), then its
    place on the ring after where its class's round-robin stopped last round (``GradingRing``:
    a place the sender cannot choose, kept for no id, so evicting an id from the book costs it
    no waiting time). So many ids, or ids whose answers grade just under the time limit, spend
    their own share, never an honest peer's."""
    return (cls, turns, size_bucket(size), distance, sender)


@dataclass
class Standing:
    """What the node knew of a sender when the round began (its book entry, read once)."""
    grade_s: float | None = None     # grading seconds per answer (None: never graded, or evicted)
    useful: bool = False             # one of its recent accepted groups carried signal
    slow: bool = False               # its answers made the grader overrun

    def group(self, timeout_s: float) -> int:
        """Its round-robin: newcomers share one whichever side of their share they are."""
        tier = grading_tier(self.grade_s, timeout_s, self.slow)
        return 4 if tier == 0 and self.useful else tier


class GradingRing:
    """Run-long, bounded: ids sit on a ring at a keyed hash of their name (the key is the node's
    secret, so no id can pick its place), and each round-robin (a sender group and size bucket)
    keeps the place where its turns stopped last round. A round serves each round-robin's
    senders in ring order from there, so every id waiting in a class gets its first turn once
    a cycle, in any arrival order and however often the book evicted it, and a thousand ids of
    one attacker take their turns one by one like anybody else: with N ids in a class and room
    for C turns a round, each gets one turn every N / C rounds. Memory: one int a round-robin.
    Not checkpointed: a resumed node draws a new secret, and every id's turn comes within a cycle."""

    def __init__(self, secret: bytes | None = None):
        self._key = secret if secret is not None else os.urandom(16)
        self._cursor: dict[tuple[int, int], int] = {}

    def place(self, sender: str) -> int:
        h = hashlib.blake2b(sender.encode("utf-8", "surrogatepass"), key=self._key, digest_size=8)
        return int.from_bytes(h.digest(), "big")

    def distance(self, sender: str, robin: tuple[int, int]) -> int:
        """How far ``sender`` sits after where ``robin`` stopped (0: its turn comes first)."""
        return (self.place(sender) - self._cursor.get(robin, 0)) % RING

    def advance(self, robin: tuple[int, int], served: int) -> None:
        """``served``: the furthest distance of a first turn given in ``robin`` this round; the
        next round starts just after it."""
        self._cursor[robin] = (self._cursor.get(robin, 0) + served + 1) % RING

    @property
    def robins(self) -> int:
        """Round-robins it keeps a cursor for (its whole memory)."""
        return len(self._cursor)


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
    robin: tuple                     # its round-robin (``GradingRing``) and its distance in it
    distance: int
    turns: int = 0


class GradingRound:
    """The turns of one round, on a clock the caller reads: ``next(now)`` gives the next turn
    (None once the budget is spent or no one waits), ``done(turn, now, ...)`` takes what it
    used and what was learned of its sender. Keys only grow (turns, class), so a heap with
    stale entries re-pushed when popped gives the order without re-ranking every sender each
    turn. When the round ends (``next`` gives None) the ring learns where each round-robin
    stopped."""

    def __init__(self, budget_s: float, timeout_s: float, now: float, ring: GradingRing):
        if not budget_s > 0 or not timeout_s > 0:
            raise ValueError("GradingRound: budget_s and timeout_s must be > 0")
        self.budget_s, self.timeout_s, self.ring = budget_s, timeout_s, ring
        self.deadline = now + budget_s
        self.newcomer_spent = 0.0
        self.waiting = {"new": 0, "front": 0}   # senders added, by standing (``newcomer_share``)
        self.turned: list[str] = []      # senders in the order their turns came
        self._senders: dict[str, _Sender] = {}
        self._heap: list[tuple] = []
        self._served: dict[tuple, int] = {}   # round-robin -> furthest first turn given
        self._closed = False

    def add(self, sender: str, standing: Standing, items: list, answers: list[int], size: int) -> None:
        """A sender's waiting rollouts (``items``, with ``answers`` answers each), all at once."""
        if sender in self._senders or len(items) != len(answers) or not items:
            raise ValueError(f"GradingRound.add: {sender!r} twice, or items and answers differ")
        group = standing.group(self.timeout_s)
        robin = (group, size_bucket(size))
        if group == 1:
            self.waiting["new"] += 1
        elif group == 4:
            self.waiting["front"] += 1
        s = _Sender(dataclasses.replace(standing), list(items), list(answers), size, robin,
                    self.ring.distance(sender, robin))
        self._senders[sender] = s
        heapq.heappush(self._heap, self._key(sender, s))

    def _key(self, sender: str, s: _Sender) -> tuple:
        cls = grading_class(s.standing, self.timeout_s, self.newcomer_spent < self.newcomer_budget_s)
        return grading_key(sender, cls, s.turns, s.size, s.distance)

    @property
    def newcomer_budget_s(self) -> float:
        """What never-graded ids may spend first this round (``newcomer_share`` of the budget)."""
        return newcomer_share(self.waiting["new"], self.waiting["front"]) * self.budget_s

    def next(self, now: float) -> Turn | None:
        while self._heap and now < self.deadline:
            left = self.deadline - now
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
        self._close()
        return None

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            for robin, served in self._served.items():
                self.ring.advance(robin, served)

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
        if s.turns == 0:                     # its round-robin has served it: next round starts after it
            self._served[s.robin] = max(self._served.get(s.robin, 0), s.distance)
        if grade_s is not None:
            s.standing.grade_s = grade_s
        s.standing.slow = s.standing.slow or overran
        s.turns += 1
        self.turned.append(turn.sender)
        if s.items:
            heapq.heappush(self._heap, self._key(turn.sender, s))
