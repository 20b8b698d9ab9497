"""The swarm guard: a swarm node that takes less from its peers when they hurt its held-out accuracy.

Training reward can rise while the model its owner takes home gets worse (docs/results.md H5). The
guard watches the held-out evals (heldout.py) of a swarm node and, when accuracy has fallen below
its best eval (the base model's, round 0, is the first best) by more than chance allows on the same
prompts, it steps down a ladder:

    0  all peers
    1  every group generated here               (batch fill off: peers' groups only on top)
    2  no peers with another tokenizer          (least like us: their text is re-tokenized)
    3  no peers with another base model either  (same tokenizer, other weights)
    4  no peers: training alone                 (it still shares its own groups)

The first step is the safe one (issue 48): a node that stops trading its own samples for peers'
loses compute, never learning, so a false alarm costs CPU, not accuracy. A step that changes
nothing is skipped (rung 1 for a node without batch fill; a rung that excludes nobody seen so far). Each eval that finds accuracy recovered
(not significantly below the best any more, and at least the base model's) takes one step back.

The test is paired, on the same prompts: the exact one-sided McNemar test on the prompts that
changed (right at the best eval and wrong now = lost, the reverse = gained); harm when
P(lost or more | a fair coin per changed prompt) < ``alpha``. Why McNemar and not two Wilson
intervals: the prompts are the same, so only the changed ones carry evidence, and the exact test
stays valid for the few changed prompts a 32-prompt eval has. The best is chosen after the fact
(the maximum of several evals), which makes a drop from it look a bit more significant than it
is; ``alpha`` = 0.05 and one step per eval keep a homogeneous swarm quiet (docs/node.md).

Fingerprints are claims. The tokenizer claim is checked where it matters (intake: a claimed
same-tokenizer group's ids must decode to its text with our tokenizer; batch: a claimed other
tokenizer in our exact encoding is ours), but a claim of our base model cannot be: anyone can
compute the public base model's log-probs for any text. So a peer that claims our tokenizer and
model stays admitted at levels 1-2 while honest peers of other models are dropped; what bounds
it is the last level (alone excludes everyone: a liar costs at most one more step) and CURVE
(bound ids). What is fixed here: claims are believed once per id — a peer is judged by every
pair of fingerprints it has claimed (noted at each eval from the peer book, and at each
admission), so one that changes its claim to ours after the guard dropped it stays dropped.

A node alone is never touched: ``SwarmGuard`` exists only for a swarm node. This module is pure:
the node feeds it eval results and the peer book, and asks ``admits`` per peer group.
"""
from __future__ import annotations

from dataclasses import dataclass

from .heldout import EvalResult
from ..metrics.stats import paired_change

MAX_REMEMBERED = 10_000      # node ids whose claims are kept (an open relay's ids are cheap)
LEVELS = ("all peers", "every group generated here (peers only on top)", "no peers of another tokenizer",
          "no peers of another tokenizer or base model", "no peers (training alone)")
OWN_GROUPS, NO_OTHER_TOKENIZER, NO_OTHER_MODEL = 1, 2, 3
ALONE = len(LEVELS) - 1
LADDER = 2          # the ladder's version in a checkpoint: 1 had no OWN_GROUPS rung


@dataclass(frozen=True)
class GuardStep:
    """What the guard decided at one eval: the level now, whether it moved, and the evidence."""
    level: int
    moved: int            # +1 took less from the swarm, −1 returned one step, 0 stayed
    harmed: bool
    line: str             # one line: the evidence and the action


class SwarmGuard:
    def __init__(self, my_tokenizer_fp: str, my_model_fp: str, *, alpha: float = 0.05, fills: bool = False):
        self.tokenizer_fp, self.model_fp = my_tokenizer_fp, my_model_fp
        self.alpha = alpha
        self.fills = fills      # batch fill on: the OWN_GROUPS rung changes something
        self.level = 0
        self.fired = 0          # how many times it took less from the swarm
        self.claims: dict[str, set] = {}   # node id -> every (tokenizer, model) fingerprint pair it claimed

    def _remember(self, node_id: str, tokenizer_fp, model_fp) -> set:
        seen = self.claims.get(node_id)
        if seen is None:
            if len(self.claims) >= MAX_REMEMBERED:
                self.claims.pop(next(iter(self.claims)))
            seen = self.claims[node_id] = set()
        if len(seen) < 8:                       # a peer that keeps changing is judged by its first 8
            seen.add((tokenizer_fp, model_fp))
        return seen

    # --- who is admitted ----------------------------------------------------------------------
    def admits(self, tokenizer_fp: str | None, model_fp: str | None, node_id: str | None = None) -> bool:
        """Whether a peer group with these fingerprints may train this node at the current level;
        with ``node_id``, every pair that id has claimed must be admitted (claims are believed once)."""
        if node_id is not None:
            return all(self._admits(t, m) for t, m in self._remember(node_id, tokenizer_fp, model_fp))
        return self._admits(tokenizer_fp, model_fp)

    def _admits(self, tokenizer_fp: str | None, model_fp: str | None) -> bool:
        if self.level >= ALONE:
            return False
        if self.level >= NO_OTHER_TOKENIZER and tokenizer_fp != self.tokenizer_fp:
            return False
        if self.level >= NO_OTHER_MODEL and model_fp != self.model_fp:
            return False
        return True

    @property
    def generates_all(self) -> bool:
        """Batch fill is off at this level: the node generates every group of its batch."""
        return self.level >= OWN_GROUPS

    def _excludes_someone(self, level: int, peers: dict) -> bool:
        """Would ``level`` change anything against the level below: exclude a peer seen so far
        that it admits, or (OWN_GROUPS) stop batch fill?"""
        if level >= ALONE:
            return True
        if level == OWN_GROUPS:
            return self.fills
        saved = self.level
        try:
            self.level = level
            now = {n for n, p in peers.items() if not self.admits(p.get("tokenizer"), p.get("model_fp"), n)}
            self.level = level - 1
            before = {n for n, p in peers.items() if not self.admits(p.get("tokenizer"), p.get("model_fp"), n)}
        finally:
            self.level = saved
        return bool(now - before)

    # --- the decision at each eval --------------------------------------------------------------
    def observe(self, result: EvalResult, best: EvalResult, base: EvalResult, peers: dict) -> GuardStep:
        """Decide on ``result`` (the newest eval) against ``best`` (compared prompt by prompt) and
        ``base``; ``peers`` = the peer book's snapshot (tokenizer and model fingerprints per peer)."""
        for node_id, p in peers.items():
            self._remember(node_id, p.get("tokenizer"), p.get("model_fp"))
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
        return {"level": self.level, "fired": self.fired, "ladder": LADDER,
                "claims": {n: sorted([t, m] for t, m in c) for n, c in self.claims.items() if len(c) > 1}}

    def load_state(self, state: dict | None) -> None:
        if state:
            level = int(state.get("level", 0))
            # a checkpoint of the 4-rung ladder: its levels 1-3 are this ladder's 2-4
            self.level = min(level + 1, ALONE) if level and state.get("ladder", 1) < LADDER else level
            self.fired = int(state.get("fired", 0))
            claims = state.get("claims")
            for node_id, pairs in (claims.items() if isinstance(claims, dict) else ()):
                for pair in pairs if isinstance(pairs, list) else ():
                    if isinstance(pair, list) and len(pair) == 2:
                        self._remember(str(node_id), *pair)
