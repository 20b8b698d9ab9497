"""What each kind of peer's groups are worth to this node, and whether they may fill its batch.

H6 (docs/results.md) found the swarm pays in one currency, tokens, that only copies of one model
can spend: at equal own tokens a Gemma node learned like its twin alone, so trading its own
samples for SmolLM2 text cost it accuracy. Batch fill therefore asks, per *kind* of peer, whether
a peer group is worth an own group before it takes an own group's slot:

* **kind**: ``same model`` (our tokenizer and base weights: the group is, up to the adapters'
  drift, one we would have generated), ``same tokenizer`` (another base model), ``other
  tokenizer``;
* **capability** (HACPO's capability ratio, arXiv 2603.02604): the kind's success rate over the
  last ``window`` rounds against ours, each Laplace-smoothed; a peer that solves less often than
  we do mostly shows us what we already do better;
* **share**: how much one of its trained samples counts against one of ours: the mean of its
  truncated IS weights capped at 1 (an own sample weighs 1; a sample the filter dropped weighs
  0). Same-model samples: ≈ 1. SmolLM2 text to a Gemma node in H6: the filter dropped ~half,
  the rest weighed ~0.75, so ≈ 0.38. Before any of the kind's samples has trained in the window,
  a prior: 1 for our tokenizer, ½ for another (whose text the filter mostly keeps only where it
  succeeded) — so such a kind is tried while it succeeds at least as often as we do, then
  judged by what its samples did;
* **value** = min(1, capability) × share. The kind fills slots while value ≥ ``threshold``.

Safe when wrong: a kind not worth a slot leaves it to the node's own generation (more own work,
never fewer samples), and its groups are not trained on top either (the smallest attack surface,
docs/relay.md). Its success keeps being measured from the groups the intake grades anyway, so a
kind that becomes worth it again is used again. Same-model peers keep filling unless they fall
far behind: with the default threshold their value sits near 1 (H4/H6's 3x saving stays).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

SAME_MODEL, SAME_TOKENIZER, OTHER_TOKENIZER = "same model", "same tokenizer", "other tokenizer"
KINDS = (SAME_MODEL, SAME_TOKENIZER, OTHER_TOKENIZER)
KEYS = {SAME_MODEL: "same_model", SAME_TOKENIZER: "same_tokenizer", OTHER_TOKENIZER: "other_tokenizer"}
PRIOR_SHARE = {SAME_MODEL: 1.0, SAME_TOKENIZER: 1.0, OTHER_TOKENIZER: 0.5}
DEFAULT_WINDOW = 8
DEFAULT_THRESHOLD = 0.5


def peer_kind(same_tokenizer: bool, peer_model_fp: str, my_model_fp: str) -> str:
    """Which kind of peer generated a group (an unknown own fingerprint: by tokenizer only)."""
    if not same_tokenizer:
        return OTHER_TOKENIZER
    return SAME_MODEL if not my_model_fp or peer_model_fp == my_model_fp else SAME_TOKENIZER


def laplace_rate(successes: float, n: int) -> float:
    """Success rate pulled toward ½ by one success and one failure (few samples: no 0 or 1)."""
    return (successes + 1.0) / (n + 2.0)


def clipped(rewards: Iterable[float]) -> list[float]:
    return [min(max(float(r), 0.0), 1.0) for r in rewards]


def _floats(xs) -> list[float]:
    if not isinstance(xs, list):
        raise TypeError(f"expected a list of numbers, got {type(xs).__name__}")
    return [float(x) for x in xs]


def _round_or_none(x) -> int | None:
    return None if x is None else int(x)


def effective_share(weights: Sequence[float]) -> float:
    """Own samples' worth per sample: each weight capped at 1 (an own sample's), averaged."""
    return sum(min(max(float(w), 0.0), 1.0) for w in weights) / len(weights)


@dataclass(frozen=True)
class Worth:
    """One kind's standing this round."""
    kind: str
    success_peer: float | None      # Laplace-smoothed, over the window (None: no groups seen)
    success_own: float
    capability: float | None        # success_peer / success_own
    share: float                    # what one of its trained samples counts against one of ours (or the prior)
    share_measured: bool            # False: the prior, none of its samples trained in the window
    value: float | None             # min(1, capability) × share
    used: bool                      # may fill slots this round
    groups: int                     # its groups seen in the window
    unused_since: int | None        # first round of the current run of rounds it was not used


@dataclass
class _Round:
    own: list[float]
    peer: dict            # kind -> list of clipped rewards of its groups seen this round
    weights: dict         # kind -> list of IS weights of its samples that trained (0 = dropped)
    groups: dict          # kind -> groups seen


class WorthBook:
    """Rolling evidence per kind of peer (see the module docstring). ``observe`` once a round,
    after the step; ``worth(kind)`` / ``allows(kind)`` decide the next round's fill."""

    def __init__(self, *, window: int = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"worth window must be a whole number of rounds ≥ 1, got {window!r}")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"worth threshold must lie in [0, 1], got {threshold!r}")
        self.window, self.threshold = window, float(threshold)
        self.rounds: deque[_Round] = deque(maxlen=window)
        self.unused_since: dict[str, int | None] = {k: None for k in KINDS}
        self.seen = {k: False for k in KINDS}

    def observe(self, round_no: int, own_rewards: Sequence[float], peer_groups: Iterable[tuple[str, Sequence[float]]],
                trained: Iterable[tuple[str, float]]) -> None:
        """One round's evidence: our own groups' rewards, each peer group seen (kind, rewards:
        the local grader's), and each peer sample that went into the step (kind, IS weight; a
        dropped sample's weight is 0). Then decide who is used next round."""
        peer, weights, groups = {k: [] for k in KINDS}, {k: [] for k in KINDS}, {k: 0 for k in KINDS}
        for kind, rewards in peer_groups:
            peer[kind] += clipped(rewards)
            groups[kind] += 1
            self.seen[kind] = True
        for kind, w in trained:
            weights[kind].append(max(float(w), 0.0))
        self.rounds.append(_Round(own=clipped(own_rewards), peer=peer, weights=weights, groups=groups))
        for kind in KINDS:
            used = self.worth(kind).used
            if used:
                self.unused_since[kind] = None
            elif self.seen[kind] and self.unused_since[kind] is None:
                self.unused_since[kind] = round_no + 1

    def worth(self, kind: str) -> Worth:
        own = [r for rd in self.rounds for r in rd.own]
        success_own = laplace_rate(sum(own), len(own))
        peer = [r for rd in self.rounds for r in rd.peer[kind]]
        groups = sum(rd.groups[kind] for rd in self.rounds)
        weights = [w for rd in self.rounds for w in rd.weights[kind]]
        share_measured = bool(weights)
        share = effective_share(weights) if weights else PRIOR_SHARE[kind]
        if not peer:
            # nothing seen in the window: a kind seen before stays as it was; an unseen kind is used
            # if it appears (its first groups are judged by the prior once graded)
            return Worth(kind, None, success_own, None, share, share_measured, None,
                         used=self.unused_since[kind] is None, groups=0, unused_since=self.unused_since[kind])
        success_peer = laplace_rate(sum(peer), len(peer))
        capability = success_peer / success_own
        value = min(1.0, capability) * share
        return Worth(kind, success_peer, success_own, capability, share, share_measured, value,
                     used=value >= self.threshold, groups=groups, unused_since=self.unused_since[kind])

    def allows(self, kind: str) -> bool:
        return self.worth(kind).used

    def fills(self) -> bool:
        """Whether peers may fill any slot next round: some kind seen in this swarm is still used
        (or none has been seen yet). False: the node generates its whole batch at once instead of
        waiting for groups it would not take."""
        seen = [k for k in KINDS if self.seen[k]]
        return not seen or any(self.allows(k) for k in seen)

    # --- checkpoint: a resumed node decides its next fill as the uninterrupted one would ------
    def state(self) -> dict:
        return {"window": self.window,
                "rounds": [{"own": r.own, "peer": r.peer, "weights": r.weights, "groups": r.groups}
                           for r in self.rounds],
                "unused_since": dict(self.unused_since), "seen": dict(self.seen)}

    def load_state(self, state: dict | None) -> None:
        """Restore what ``state`` wrote; a state from another window size, or one that does not
        read as this book's, leaves the book empty (its evidence is rebuilt in ``window`` rounds:
        more own generation meanwhile, never fewer samples)."""
        if not state:
            return
        try:
            rounds = [_Round(own=_floats(r["own"]),
                             peer={k: _floats(r["peer"][k]) for k in KINDS},
                             weights={k: _floats(r["weights"][k]) for k in KINDS},
                             groups={k: int(r["groups"][k]) for k in KINDS}) for r in state["rounds"]]
            unused = {k: _round_or_none(state["unused_since"][k]) for k in KINDS}
            seen = {k: bool(state["seen"][k]) for k in KINDS}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"worth book in the checkpoint does not read: {e!r}") from None
        if state.get("window") != self.window:
            return                      # another window measures another thing: start over
        self.rounds.clear()
        self.rounds.extend(rounds[-self.window:])
        self.unused_since, self.seen = unused, seen

    def metrics(self) -> dict:
        """The round record's ``worth/<kind>/…`` keys (docs/metrics.md)."""
        out = {}
        for kind in KINDS:
            w = self.worth(kind)
            key = KEYS[kind]
            out[f"worth/{key}/value"] = w.value
            out[f"worth/{key}/capability"] = w.capability
            out[f"worth/{key}/share"] = w.share
            out[f"worth/{key}/used"] = int(w.used)
        return out


def describe(w: Worth, *, own_groups: int, batch: int) -> str:
    """The dashboard's sentence for one kind, e.g. 'other-tokenizer peers: not used since round
    17 — your success 62% > theirs 48%; you generated 4 of 4 groups this round'."""
    who = f"{w.kind} peers"
    if w.success_peer is None:
        return f"{who}: none seen lately"
    rates = f"your success {w.success_own:.0%} {'>' if w.success_own > w.success_peer else '≤'} " \
            f"theirs {w.success_peer:.0%}"
    share = "" if w.share >= 0.95 else f", {w.share:.0%} of their samples count"
    if w.used:
        return (f"{who}: used, worth {w.value:.2f} of an own group ({rates}{share}); "
                f"you generated {own_groups} of {batch} groups this round")
    since = f" since round {w.unused_since}" if w.unused_since else ""
    return f"{who}: not used{since} — {rates}{share}; you generated {own_groups} of {batch} groups this round"
