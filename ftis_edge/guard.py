"""The swarm guard: a swarm node that takes less from its peers when they hurt its held-out accuracy.

Training reward can rise while the model its owner takes home gets worse (docs/results.md H5). The
guard watches the held-out evals (heldout.py) of a swarm node and, when accuracy has fallen below
its best eval (the base model's, round 0, is the first best) by more than chance allows on the same
prompts, it steps down a ladder:

    0  all peers
    1  no peers with another tokenizer          (least like us: their text is re-tokenized)
    2  no peers with another base model either  (same tokenizer, other weights)
    3  no peers: training alone                 (it still shares its own groups)

A step that would exclude nobody seen so far is skipped. Each eval that finds accuracy recovered
(not significantly below the best any more, and at least the base model's) takes one step back.

The test is paired, on the same prompts: the exact one-sided McNemar test on the prompts that
changed (right at the best eval and wrong now = lost, the reverse = gained); harm when
P(lost or more | a fair coin per changed prompt) < ``alpha``. Why McNemar and not two Wilson
intervals: the prompts are the same, so only the changed ones carry evidence, and the exact test
stays valid for the few changed prompts a 32-prompt eval has. The best is chosen after the fact
(the maximum of several evals), which makes a drop from it look a bit more significant than it
is; ``alpha`` = 0.05 and one step per eval keep a homogeneous swarm quiet (docs/node.md).

A node alone is never touched: ``SwarmGuard`` exists only for a swarm node. This module is pure:
the node feeds it eval results and the peer book, and asks ``admits`` per peer group.
"""
from __future__ import annotations

from dataclasses import dataclass

from .heldout import EvalResult
from .stats import paired_change

LEVELS = ("all peers", "no peers of another tokenizer", "no peers of another tokenizer or base model",
          "no peers (training alone)")
ALONE = len(LEVELS) - 1


@dataclass(frozen=True)
class GuardStep:
    """What the guard decided at one eval: the level now, whether it moved, and the evidence."""
    level: int
    moved: int            # +1 took less from the swarm, −1 returned one step, 0 stayed
    harmed: bool
    line: str             # one line: the evidence and the action


class SwarmGuard:
    def __init__(self, my_tokenizer_fp: str, my_model_fp: str, *, alpha: float = 0.05):
        self.tokenizer_fp, self.model_fp = my_tokenizer_fp, my_model_fp
        self.alpha = alpha
        self.level = 0
        self.fired = 0          # how many times it took less from the swarm

    # --- who is admitted ----------------------------------------------------------------------
    def admits(self, tokenizer_fp: str | None, model_fp: str | None) -> bool:
        """Whether a peer group with these fingerprints may train this node at the current level."""
        if self.level >= ALONE:
            return False
        if self.level >= 1 and tokenizer_fp != self.tokenizer_fp:
            return False
        if self.level >= 2 and model_fp != self.model_fp:
            return False
        return True

    def _excludes_someone(self, level: int, peers: dict) -> bool:
        """Would ``level`` exclude any peer seen so far that the level below admits?"""
        if level >= ALONE:
            return True
        saved = self.level
        try:
            self.level = level
            now = {n for n, p in peers.items() if not self.admits(p.get("tokenizer"), p.get("model_fp"))}
            self.level = level - 1
            before = {n for n, p in peers.items() if not self.admits(p.get("tokenizer"), p.get("model_fp"))}
        finally:
            self.level = saved
        return bool(now - before)

    # --- the decision at each eval --------------------------------------------------------------
    def observe(self, result: EvalResult, best: EvalResult, base: EvalResult, peers: dict) -> GuardStep:
        """Decide on ``result`` (the newest eval) against ``best`` (compared prompt by prompt) and
        ``base``; ``peers`` = the peer book's snapshot (tokenizer and model fingerprints per peer)."""
        ch = paired_change(result.correct, best.correct)
        p = ch.p_worse
        harmed = ch.lost > ch.gained and p < self.alpha
        evidence = (f"held-out {100 * result.accuracy:.0f}% vs best {100 * best.accuracy:.0f}% (round {best.round}) "
                    f"on the same {result.n} prompts: {ch.lost} lost, {ch.gained} gained, McNemar p={p:.3f}")
        if harmed:
            target = self.level + 1
            while target < ALONE and not self._excludes_someone(target, peers):
                target += 1
            if self.level >= ALONE:
                return GuardStep(self.level, 0, True, f"{evidence}: still below; already {LEVELS[self.level]}")
            self.level = min(target, ALONE)
            self.fired += 1
            return GuardStep(self.level, +1, True, f"{evidence} < alpha {self.alpha:g}: now {LEVELS[self.level]}")
        recovered = result.accuracy >= base.accuracy
        if self.level > 0 and recovered:
            target = self.level - 1
            while target > 0 and not self._excludes_someone(target, peers):
                target -= 1
            self.level = target
            return GuardStep(self.level, -1, False, f"{evidence}; at or above base {100 * base.accuracy:.0f}%: "
                                                    f"back to {LEVELS[self.level]}")
        if self.level > 0:
            return GuardStep(self.level, 0, False, f"{evidence}; below base {100 * base.accuracy:.0f}%: "
                                                   f"staying at {LEVELS[self.level]}")
        return GuardStep(self.level, 0, False, f"{evidence}: no harm")

    def state(self) -> dict:
        return {"level": self.level, "fired": self.fired}

    def load_state(self, state: dict | None) -> None:
        if state:
            self.level = int(state.get("level", 0))
            self.fired = int(state.get("fired", 0))
