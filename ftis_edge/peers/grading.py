"""The re-grading scheduler's rules: tiers by what a sender's answers cost, classes served in
order, and the key that orders senders within a round (``Intake`` applies them)."""
from __future__ import annotations

from .book import PeerStats

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


def grading_class(peer: PeerStats, timeout_s: float, slow: bool, newcomers_may: bool) -> int:
    """Where a sender's next rollout stands in the round's grading (lower first): in front, a
    fast peer whose recent groups carried signal, and a never-graded id while the round's
    newcomers have spent less than ``NEWCOMER_SHARE`` of the budget (``newcomers_may``); then
    other never-graded ids; a fast peer whose groups never did; one whose answers grade
    slowly; one that made the grader overrun. So a crowd of new ids cannot push known useful
    peers out, and a crowd of known ids cannot keep a new one out."""
    tier = grading_tier(peer.grade_s, timeout_s, slow)
    if tier == 1:
        return FRONT if newcomers_may else NEWCOMER
    if tier == 0:
        return FRONT if any(peer.signal_recent) else KNOWN
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
