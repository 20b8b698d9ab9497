"""Kin, not crowds (issue 65): which peers may fill this node's own slots, and how many slots.

H7 and H8 re-read side by side: a node whose peers are copies of its model (its *kin*) keeps
its level on a quarter of its own generation, while a full fine-tuning node among LoRA peers
ended 13 points below its twin alone and a Gemma node 18 below, both on the same 1-of-4 own
share. So a node gives up own slots only to peers whose groups are worth own groups, judged per
peer on evidence the node checks itself:

* **share**: what the peer's samples weighed in this node's step against own ones (the step
  weight of ``batch.peer_usage``: truncated IS weight capped at 1 × every bound and factor the
  learner applies; 0 when dropped or refused), averaged over the window. Kin need ``share_min``
  (near-full: another tokenizer's bounded text never gets there). A peer never measured is
  measured first (``measuring``): the round passes its groups through the learner without
  training on them (rounds.Round.measure) beside a full own batch, so learning never waits on a
  guess. Once measured, a window without its samples keeps
  the last measured share.
* **capability**: the peer's success on its groups (graded here) over ours, each
  Laplace-smoothed over the window: kin must be at least ``capability_min`` as capable, less one
  standard error of the difference (``CAPABILITY_Z``: a twin is not shut out by chance). The
  gate closes when a peer falls behind this node (the full fine-tuning node among LoRA peers).

Slots given up follow how much kin a node has: with k kin peers at most B·k/(k+1) of its B
groups (one kin: half, three: three quarters); a node without kin generates its whole batch.
Memory is bounded (``MAX_PEERS``, the least recently seen unmeasured peer forgotten first) and a crowd of new ids is
measured ``MAX_MEASURED`` groups a round at most, so Sybil ids cost the node a bounded forward
pass and move no slot: an id becomes kin only by samples that carry weight in this node's step.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .worth import clipped, effective_share, laplace_rate

DEFAULT_SHARE_MIN = 0.9          # near-full weight: same-model peers weigh 0.96-1.0 in H7's records
DEFAULT_CAPABILITY_MIN = 0.9     # at least as capable, less the window's noise (8 rounds of one group)
MAX_PEERS = 1024                 # peers remembered (least recently seen forgotten first)
CAPABILITY_Z = 1.0               # the capability gate's allowance for noise, in standard errors
MAX_MEASURED = 2                 # groups of unmeasured peers measured (not trained) per round


@dataclass
class _Peer:
    rounds: deque                                 # (round, clipped rewards, step weights) per round seen
    share: float | None = None                    # last measured share (None: never measured)


@dataclass(frozen=True)
class Standing:
    """One peer's standing this round."""
    peer: str
    success: float | None       # Laplace-smoothed over the window (None: no groups in it)
    capability: float | None    # success / ours
    share: float | None         # what its samples weighed in our step (None: never measured)
    kin: bool


@dataclass
class KinBook:
    """Per-peer evidence over ``window`` rounds (see the module). ``observe`` once a round, after
    the step; ``kin()``, ``slots(B)`` and ``measuring(peer)`` decide the next round's fill."""
    window: int = 8
    share_min: float = DEFAULT_SHARE_MIN
    capability_min: float = DEFAULT_CAPABILITY_MIN
    own: deque = field(default=None)              # clipped own rewards per round
    peers: OrderedDict = field(default_factory=OrderedDict)
    last_said: str = field(default="", repr=False)  # the last words node.log got (said again on a change)

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"kin window must be a whole number of rounds ≥ 1, got {self.window!r}")
        for name in ("share_min", "capability_min"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0 and math.isfinite(v)):
                raise ValueError(f"kin {name} must lie in [0, 1], got {v!r}")
        self.own = deque(maxlen=self.window)

    def observe(self, round_no: int, own_rewards: Sequence[float], groups: Iterable[tuple[str, Sequence[float]]],
                trained: Iterable[tuple[str, float]]) -> None:
        """One round: our own rewards, each peer group graded here (peer id, rewards), and each
        peer sample in the step (peer id, its step weight)."""
        self.own.append(clipped(own_rewards))
        rewards: dict[str, list[float]] = {}
        weights: dict[str, list[float]] = {}
        for peer, rs in groups:
            rewards.setdefault(str(peer), []).extend(clipped(rs))
        for peer, w in trained:
            weights.setdefault(str(peer), []).append(max(0.0, float(w)))
        for peer in set(rewards) | set(weights):
            p = self.peers.get(peer)
            if p is None:
                p = self.peers[peer] = _Peer(rounds=deque(maxlen=self.window))
            self.peers.move_to_end(peer)
            p.rounds.append((round_no, rewards.get(peer, []), weights.get(peer, [])))
        oldest = round_no - self.window + 1
        for p in self.peers.values():
            while p.rounds and p.rounds[0][0] < oldest:
                p.rounds.popleft()
            ws = [w for _, _, wr in p.rounds for w in wr]
            if ws:
                p.share = effective_share(ws)
        while len(self.peers) > MAX_PEERS:      # after the shares: this round's measured peers stay
            self._forget_one()

    def _forget_one(self) -> None:
        """Forget the least recently seen peer never measured (a crowd of new ids cannot push a
        measured peer out), else the least recently seen."""
        victim = next((peer for peer, p in self.peers.items() if p.share is None), None)
        if victim is None:
            self.peers.popitem(last=False)
        else:
            del self.peers[victim]

    def own_success(self) -> float:
        own = [r for rd in self.own for r in rd]
        return laplace_rate(sum(own), len(own))

    def standing(self, peer: str) -> Standing:
        p = self.peers.get(peer)
        if p is None:
            return Standing(peer, None, None, None, False)
        rs = [r for _, rr, _ in p.rounds for r in rr]
        success = laplace_rate(sum(rs), len(rs)) if rs else None
        capability = None if success is None else success / self.own_success()
        kin = (p.share is not None and p.share >= self.share_min
               and success is not None and self._capable(success, len(rs)))
        return Standing(peer, success, capability, p.share, kin)

    def _capable(self, success: float, n: int) -> bool:
        """At least ``capability_min`` as capable as we are, unless the window shows it behind by
        more than its noise (CAPABILITY_Z standard errors of the difference): one group a round
        over 8 rounds is 64 samples, and a twin's rate ratio wanders 0.7-1.4 by chance alone."""
        own = [r for rd in self.own for r in rd]
        mine = self.own_success()
        se = math.sqrt(success * (1 - success) / (n + 2) + mine * (1 - mine) / (len(own) + 2))
        return success >= self.capability_min * mine - CAPABILITY_Z * se

    def kin(self) -> list[str]:
        """The peers that may fill own slots next round."""
        return [peer for peer in self.peers if self.standing(peer).kin]

    def is_kin(self, peer: str) -> bool:
        return self.standing(peer).kin

    def measuring(self, peer: str) -> bool:
        """A peer whose share was never measured: its groups are measured, not trained (Round.measure)."""
        p = self.peers.get(peer)
        return p is None or p.share is None

    def slots(self, batch: int) -> int:
        """Own slots given up next round: ⌊B·k/(k+1)⌋ for k kin peers (none: 0)."""
        k = len(self.kin())
        return batch * k // (k + 1)

    def said(self, own_groups: int, batch: int, kin: int | None = None) -> str:
        """The round in words (node.log, the dashboard, the stop summary); ``kin``: how many kin
        peers the round had (default: the book's now)."""
        k = len(self.kin()) if kin is None else kin
        if not k:
            return f"no peer of your kind: you generate {own_groups} of {batch} groups"
        return (f"{k} peer{'s' if k > 1 else ''} of your kind (samples weigh ≥ "
                f"{self.share_min:.0%} of yours in your step, success ≥ {self.capability_min:.0%} of yours "
                f"within noise): you generate {own_groups} of {batch} groups")

    def metrics(self) -> dict:
        kin = self.kin()
        shares = [self.peers[p].share for p in kin]
        return {"kin/peers": len(kin), "kin/share": min(shares) if shares else None,
                "kin/known": len(self.peers)}

    # --- checkpoint ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"window": self.window, "own": [list(r) for r in self.own],
                "peers": [[peer, p.share, [[rnd, list(rs), list(ws)] for rnd, rs, ws in p.rounds]]
                          for peer, p in self.peers.items()]}

    def load_state(self, state: dict | None) -> None:
        """Restore what ``state`` wrote (another window: start over, more own generation meanwhile)."""
        if not state or state.get("window") != self.window:
            return
        try:
            own = [[float(x) for x in r] for r in state["own"]]
            peers = [(str(peer), None if share is None else float(share),
                      [(int(rnd), [float(x) for x in rs], [float(x) for x in ws]) for rnd, rs, ws in rounds])
                     for peer, share, rounds in state["peers"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"kin book in the checkpoint does not read: {e!r}") from None
        self.own = deque(own[-self.window:], maxlen=self.window)
        self.peers = OrderedDict()
        for peer, share, rounds in peers[-MAX_PEERS:]:
            self.peers[peer] = _Peer(rounds=deque(rounds[-self.window:], maxlen=self.window), share=share)
