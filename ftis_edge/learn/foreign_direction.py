"""How far text claimed to come from another tokenizer may move the weights in any one direction
(issue 62 item 2).

``ForeignBudget`` bounds each peer's *pull* (|advantage| x weight), a scalar: it cannot tell a
drip — one payload pushed step after step — from an honest peer of the same pull, and a drip
under it still rose 1.1-1.4 nats over 60 steps. What tells them apart is direction. An honest
peer answers a new question each step and its group's advantages are zero-mean, so what its
answers share (their style) cancels within the group and what is left points a new way each
step: summed over steps it grows like a random walk, ~sqrt(n). A payload points the same way
every step and grows like n.

So this bounds the *sum* of the gradient a peer has put into the steps, not each step's size.
``D_p`` is peer p's applied gradient, summed with a decay (``horizon`` steps); before a step the
peer's gradient ``g_p`` is scaled by the largest ``s <= 1`` with

    |gamma D_p + s g_p| <= peer_budget x R,    and for all such peers together
    |gamma K + k sum_p s_p g_p| <= kind_budget x R     (K = the kind's sum; a crowd of ids shares it)

where R is the running mean norm of the rest of the step's gradient (text this node checks).
The kind's budget is one peer's per peer the node can tell apart, at most ``kind_budget``: ids
are free, so unless they are names bound to keys (``distinct_peers``: node ids named in
train.other_tokenizer_peers on a relay with CURVE keys) a crowd of them is one peer. Two ids of one
attacker then share what one gets (+0.65 / +0.76 nats over control at 60 steps, one id +0.63 / +0.74:
docs/relay.md, item 2).
Whatever the payload's direction u, its share <u, D_p> is at most |D_p|: a bound on the update,
not on the weight. A sum already over its bound (after a restore) may shrink, never grow.

Memory: one vector of the trainable parameters per tracked peer and one for the kind (a LoRA
adapter: ~4 MB each), and during a step one gradient per such peer in it (at most the slots the
swarm fills). At most ``max_peers`` peers are tracked, and no more than ``max_bytes`` of sums (a
fully fine-tuned 135M model: one peer); a new one evicts the smallest sum (the kind's sum still
holds it). Gradients are handed in by ``Learner.compute_gradients``
(``apart=``), which runs each such peer's samples in micro-batches of their own; ``decide``
returns the scales and ``commit`` books them once the optimiser step is taken.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..rollout.samples import TrainSample
from .foreign_budget import claimed_foreign

DEFAULT_HORIZON = 100          # steps: the decay gamma = 1 - 1/horizon
DEFAULT_PEER_BUDGET = 0.5      # |D_p| in units of the step's own gradient norm (set in docs/relay.md)
DEFAULT_KIND_BUDGET = 1.0
DEFAULT_MAX_PEERS = 8
DEFAULT_MAX_BYTES = 256 * 2**20


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def largest_step(a: torch.Tensor, g: torch.Tensor, bound: float) -> float:
    """The largest s in [0, 1] with |a + s g| <= max(bound, |a|): a sum may shrink, never pass
    its bound. (The upper root of |a|^2 + 2 s a.g + s^2 |g|^2 = B^2, B^2 >= |a|^2.)"""
    gg = float(g @ g)
    if gg == 0.0:
        return 1.0
    aa, ag = float(a @ a), float(a @ g)
    b2 = max(bound * bound, aa)
    root = (-ag + math.sqrt(max(ag * ag + gg * (b2 - aa), 0.0))) / gg
    return max(0.0, min(1.0, root))


def claimed_foreign_peer(s: TrainSample) -> str | None:
    """The peer whose gradient this bounds: text re-tokenized here (no judge checks it)."""
    return s.source if claimed_foreign(s) else None


@dataclass
class ForeignDirection:
    horizon: int = DEFAULT_HORIZON
    peer_budget: float = DEFAULT_PEER_BUDGET
    kind_budget: float = DEFAULT_KIND_BUDGET
    distinct_peers: int = 0                        # peers told apart by key (0: ids are claims)
    max_peers: int = DEFAULT_MAX_PEERS
    max_bytes: int = DEFAULT_MAX_BYTES
    sums: dict = field(default_factory=dict)       # peer -> D_p (flat, fp32)
    kind: torch.Tensor | None = None               # K
    ref: float = 0.0                               # the decayed sum of the rest's gradient norms ...
    ref_weight: float = 0.0                        # ... and of the weights (R = ref / ref_weight)
    pending: dict | None = None
    last: dict = field(default_factory=dict)       # the last decision: kept share, smallest scale

    key = staticmethod(claimed_foreign_peer)

    def __post_init__(self):
        if not isinstance(self.horizon, int) or self.horizon < 1:
            raise ValueError(f"foreign direction horizon must be a whole number of steps >= 1, got {self.horizon!r}")
        if self.peer_budget < 0 or self.kind_budget < 0:
            raise ValueError("foreign direction budgets must be >= 0")
        if not isinstance(self.distinct_peers, int) or self.distinct_peers < 0:
            raise ValueError(f"foreign direction distinct_peers must be a whole number >= 0, got {self.distinct_peers!r}")
        if self.max_peers < 1:
            raise ValueError("foreign direction max_peers must be >= 1")

    @property
    def gamma(self) -> float:
        return 1.0 - 1.0 / self.horizon

    @property
    def kind_room(self) -> float:
        """The kind's budget: one peer's for each peer told apart by key, at most ``kind_budget``."""
        return min(self.kind_budget, self.peer_budget * max(1, self.distinct_peers))

    def reference(self, rest_norm: float) -> float:
        """R: the running mean of the rest's gradient norm, this step's included (bias-corrected)."""
        return (self.gamma * self.ref + rest_norm) / (self.gamma * self.ref_weight + 1.0)

    def decide(self, rest: Sequence[torch.Tensor], grads: dict[str, Sequence[torch.Tensor]]) -> dict[str, float]:
        """Each peer's scale for this step, given the rest of the step's gradient and each peer's
        (lists of tensors, one per trainable parameter). Books nothing until ``commit``."""
        rest_v = flat(rest)
        if self.kind is not None and self.kind.numel() != rest_v.numel():    # another model: start over
            self.sums, self.kind = {}, None
        rest_norm = float(rest_v.norm())
        # no rest of the step (nothing this node checks): no room, whatever the history
        R = self.reference(rest_norm) if rest_norm > 0 else 0.0
        gam = self.gamma
        zeros = torch.zeros_like(rest_v)
        vec = {p: flat(g) for p, g in grads.items()}
        scale = {p: largest_step(gam * self.sums.get(p, zeros), v, self.peer_budget * R) for p, v in vec.items()}
        total = sum((scale[p] * v for p, v in vec.items()), zeros)
        k = largest_step(gam * (self.kind if self.kind is not None else zeros), total, self.kind_room * R)
        scale = {p: x * k for p, x in scale.items()}
        norm = {p: float(v.norm()) for p, v in vec.items()}
        offered = sum(norm.values())
        self.pending = {"rest_norm": rest_norm, "vec": vec, "scale": scale, "total": total * k}
        # what the learner reports, and what benchmarks/foreign_honest_stream.py reads (does a peer
        # keep pointing where it pointed before: cos(g_p, D_p))
        self.last = {"kept": sum(scale[p] * norm[p] for p in vec) / offered if offered else 1.0,
                     "min_scale": min(scale.values()) if scale else 1.0, "scale": scale, "vec_norm": norm,
                     "cos": {p: float(v @ self.sums[p]) / (norm[p] * float(self.sums[p].norm()))
                             for p, v in vec.items() if p in self.sums and norm[p] and float(self.sums[p].norm())}}
        return scale

    def commit(self) -> None:
        """Book the decided step (the optimiser step was taken); every sum decays one step. Only
        steps that held such text count: a peer that sends every other step gets no more decay."""
        if self.pending is None:
            return
        pend, self.pending, gam = self.pending, None, self.gamma
        self.ref = gam * self.ref + pend["rest_norm"]
        self.ref_weight = gam * self.ref_weight + 1.0
        for p in list(self.sums):
            self.sums[p] = self.sums[p] * gam
        for p, v in pend["vec"].items():
            if pend["scale"][p] > 0 or p in self.sums:
                self.sums[p] = self.sums.get(p, torch.zeros_like(v)) + pend["scale"][p] * v
        self.kind = pend["total"] if self.kind is None else self.kind * gam + pend["total"]
        while len(self.sums) > self.tracked():     # evict the smallest sum: the kind's still holds it
            del self.sums[min(self.sums, key=lambda p: float(self.sums[p].norm()))]

    def tracked(self) -> int:
        """How many peers' sums are kept: ``max_peers``, fewer where they would pass ``max_bytes``."""
        size = 4 * (self.kind.numel() if self.kind is not None else 0)
        return max(1, min(self.max_peers, self.max_bytes // size if size else self.max_peers))

    def discard(self) -> None:
        """The step was skipped: nothing moved."""
        self.pending = None

    # --- checkpoint -------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"horizon": self.horizon, "sums": {p: v.cpu() for p, v in self.sums.items()},
                "kind": None if self.kind is None else self.kind.cpu(), "ref": self.ref, "ref_weight": self.ref_weight}

    def load_state(self, state: dict | None) -> None:
        if not state or state.get("horizon") != self.horizon:
            return
        try:
            sums = {str(p): v.float() for p, v in state["sums"].items()}
            kind = None if state["kind"] is None else state["kind"].float()
            ref, ref_weight = float(state["ref"]), float(state["ref_weight"])
            sizes = {v.numel() for v in sums.values()} | ({kind.numel()} if kind is not None else set())
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"foreign direction sums in the checkpoint do not read: {e!r}") from None
        if len(sizes) > 1 or any(v.dim() != 1 for v in sums.values()):
            raise ValueError("foreign direction sums in the checkpoint do not read: sizes differ")
        self.sums, self.kind, self.ref, self.ref_weight = sums, kind, ref, ref_weight
