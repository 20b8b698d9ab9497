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
* **share**: how much one of its samples weighs in this node's step against one of ours: its
  truncated IS weight capped at 1 times every bound and factor the learner applies (the
  foreign-tokenizer bound, a success weight, the plausibility judge's 0, the filter's 0), averaged
  (``batch.PeerSampleUse.step_weight``). Same-model samples: ≈ 1. SmolLM2 text to a Gemma node
  under the bound: ≈ 0.005-0.06, not the 0.09-0.76 its bare IS weights said (issue 65). A kind
  never measured starts from a prior below the threshold (``prior_share``: half the threshold
  for our tokenizer, the bound for another), so it fills no slot until its samples have been
  measured (rounds.Round.measure: a pass without training); once measured, a window
  with none of its samples keeps the last measured share (no return to the prior);
* **value** = min(1, capability) × share. The kind fills slots while value ≥ ``threshold``.

Evidence the node can check (issue 62.6): a kind's success and share are means over its
*peers*, each weighed by its standing, how many of its samples carried weight in this node's
step (at most ``STANDING_SAMPLES``): any number of ids sending all-wrong or all-right groups
(no signal: never trained) moves a kind that has a standing peer not at all.

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
DEFAULT_WINDOW = 8
DEFAULT_THRESHOLD = 0.5
STANDING_SAMPLES = 8        # samples that carried weight in our step for a peer's full say (one group)
MAX_IDS = 256               # peer ids kept apart per kind a round (memory bound); more share one entry
MORE = "(more ids)"


def prior_share(kind: str, threshold: float, other_bound: float) -> float:
    """An unmeasured kind's share: below ``threshold`` by construction (half of it for our
    tokenizer; another tokenizer's is the learner's bound on it, ``other_bound``, 0 when its text
    is not trained), so no kind fills a slot on a guess."""
    return min(other_bound, 0.5 * threshold) if kind == OTHER_TOKENIZER else 0.5 * threshold


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
    share: float                    # what one of its samples weighs in our step against one of ours (or the prior)
    share_measured: bool            # False: the prior, none of its samples ever measured in a step
    value: float | None             # min(1, capability) × share
    used: bool                      # may fill slots this round
    groups: int                     # its groups seen in the window
    unused_since: int | None        # first round of the current run of rounds it was not used


@dataclass
class _Round:
    own: list[float]
    peer: dict            # kind -> {peer id: clipped rewards of its groups seen this round}
    weights: dict         # kind -> {peer id: step weights of its samples in our step (0 = dropped, refused)}
    groups: dict          # kind -> groups seen


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _by_standing(rewards: dict, weights: dict) -> tuple[float | None, float | None]:
    """(success, share) of one kind over its peers, each peer weighed by its standing (samples
    that carried weight in our step, at most STANDING_SAMPLES); (None, None) when no peer has any."""
    standing = {p: min(STANDING_SAMPLES, sum(w > 0 for w in ws)) for p, ws in weights.items()}
    total = sum(standing.values())
    if not total:
        return None, None
    success = [(s, laplace_rate(sum(rewards[p]), len(rewards[p]))) for p, s in standing.items()
               if s and rewards.get(p)]
    share = sum(s * effective_share(weights[p]) for p, s in standing.items() if s) / total
    n = sum(s for s, _ in success)
    return (sum(s * r for s, r in success) / n if n else None), share


class WorthBook:
    """Rolling evidence per kind of peer (see the module docstring). ``observe`` once a round,
    after the step; ``worth(kind)`` / ``allows(kind)`` decide the next round's fill."""

    def __init__(self, *, window: int = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD,
                 other_bound: float = 0.0):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"worth window must be a whole number of rounds ≥ 1, got {window!r}")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"worth threshold must lie in [0, 1], got {threshold!r}")
        self.window, self.threshold = window, float(threshold)
        self.other_bound = float(other_bound)     # what the learner lets one other-tokenizer sample weigh
        self.rounds: deque[_Round] = deque(maxlen=window)
        self.unused_since: dict[str, int | None] = {k: None for k in KINDS}
        self.seen = {k: False for k in KINDS}
        self.last_share: dict[str, float | None] = {k: None for k in KINDS}   # the last measured share

    def observe(self, round_no: int, own_rewards: Sequence[float], peer_groups: Iterable[tuple],
                trained: Iterable[tuple]) -> None:
        """One round's evidence: our own groups' rewards, each peer group seen (kind, rewards: the
        local grader's[, peer id]), and each peer sample that went into the step (kind, the weight
        it carried in the step: ``PeerSampleUse.step_weight``[, peer id]). Then decide who is used
        next round. Without a peer id every entry counts as one anonymous peer of its kind."""
        peer, weights, groups = {k: {} for k in KINDS}, {k: {} for k in KINDS}, {k: 0 for k in KINDS}
        for kind, rewards, *who in peer_groups:
            key = str(who[0]) if who else ""
            if key not in peer[kind] and len(peer[kind]) >= MAX_IDS:
                key = MORE          # a flood of ids: one entry, no standing (it never trained)
            peer[kind].setdefault(key, []).extend(clipped(rewards))
            groups[kind] += 1
            self.seen[kind] = True
        for kind, w, *who in trained:
            weights[kind].setdefault(str(who[0]) if who else "", []).append(max(float(w), 0.0))
        self.rounds.append(_Round(own=clipped(own_rewards), peer=peer, weights=weights, groups=groups))
        for kind in KINDS:
            share = self._measured_share(kind)
            if share is not None:
                self.last_share[kind] = share
            used = self.worth(kind).used
            if used:
                self.unused_since[kind] = None
            elif self.seen[kind] and self.unused_since[kind] is None:
                self.unused_since[kind] = round_no + 1

    def _window(self, kind: str) -> tuple[dict, dict]:
        rewards, weights = {}, {}
        for rd in self.rounds:
            for p, rs in rd.peer[kind].items():
                rewards.setdefault(p, []).extend(rs)
            for p, ws in rd.weights[kind].items():
                weights.setdefault(p, []).extend(ws)
        return rewards, weights

    def _measured_share(self, kind: str) -> float | None:
        """The window's share of ``kind`` (None: none of its samples was in a step in the window)."""
        rewards, weights = self._window(kind)
        if not weights:
            return None
        _, share = _by_standing(rewards, weights)
        return 0.0 if share is None else share      # every sample weighed 0: measured, worth nothing

    def measured(self, kind: str) -> bool:
        """Some of its samples have been in one of our steps (its share is not a prior)."""
        return self.last_share[kind] is not None

    def worth(self, kind: str) -> Worth:
        own = [r for rd in self.rounds for r in rd.own]
        success_own = laplace_rate(sum(own), len(own))
        rewards, weights = self._window(kind)
        groups = sum(rd.groups[kind] for rd in self.rounds)
        share_measured = self.measured(kind)
        share = self.last_share[kind] if share_measured else prior_share(kind, self.threshold, self.other_bound)
        if not rewards:
            # nothing seen in the window: a kind seen before stays as it was (a measured one on its
            # last measured share, never back to the prior); an unseen kind is not used on a guess
            return Worth(kind, None, success_own, None, share, share_measured, None,
                         used=share_measured and self.unused_since[kind] is None, groups=0,
                         unused_since=self.unused_since[kind])
        success_peer, _ = _by_standing(rewards, weights)
        if success_peer is None:        # no peer of the kind has standing: every group, one vote each
            flat = [r for rs in rewards.values() for r in rs]
            success_peer = laplace_rate(sum(flat), len(flat))
        capability = success_peer / success_own
        value = min(1.0, capability) * share
        return Worth(kind, success_peer, success_own, capability, share, share_measured, value,
                     used=share_measured and value >= self.threshold, groups=groups,
                     unused_since=self.unused_since[kind])

    def allows(self, kind: str) -> bool:
        return self.worth(kind).used

    def fills(self) -> bool:
        """Whether peers may fill any slot next round: some kind seen in this swarm is used. False:
        the node generates its whole batch at once instead of waiting for groups it would not take
        (an unmeasured kind's groups are measured, not trained)."""
        return any(self.allows(k) for k in KINDS if self.seen[k])

    # --- checkpoint: a resumed node decides its next fill as the uninterrupted one would ------
    def state(self) -> dict:
        return {"version": 2, "window": self.window,
                "rounds": [{"own": r.own, "peer": r.peer, "weights": r.weights, "groups": r.groups}
                           for r in self.rounds],
                "unused_since": dict(self.unused_since), "seen": dict(self.seen),
                "last_share": dict(self.last_share)}

    def load_state(self, state: dict | None) -> None:
        """Restore what ``state`` wrote; a state from another window size or an older book, or one
        that does not read as this book's, leaves the book empty (its evidence is rebuilt in
        ``window`` rounds: more own generation meanwhile, never fewer samples)."""
        if not state or state.get("version") != 2:
            return
        try:
            rounds = [_Round(own=_floats(r["own"]),
                             peer={k: {str(p): _floats(v) for p, v in r["peer"][k].items()} for k in KINDS},
                             weights={k: {str(p): _floats(v) for p, v in r["weights"][k].items()} for k in KINDS},
                             groups={k: int(r["groups"][k]) for k in KINDS}) for r in state["rounds"]]
            unused = {k: _round_or_none(state["unused_since"][k]) for k in KINDS}
            seen = {k: bool(state["seen"][k]) for k in KINDS}
            last = {k: None if state["last_share"][k] is None else float(state["last_share"][k]) for k in KINDS}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"worth book in the checkpoint does not read: {e!r}") from None
        if state.get("window") != self.window:
            return                      # another window measures another thing: start over
        self.rounds.clear()
        self.rounds.extend(rounds[-self.window:])
        self.unused_since, self.seen, self.last_share = unused, seen, last

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
