"""What this node knows of each peer: its counts, its samples' KL by bin, its grading record and
its quarantine (``PeerStats``), for at most ``MAX_PEERS`` peers (``PeerBook``). Node, round,
checkpoint and the Peers tab read it; intake writes it."""
from __future__ import annotations

import bisect
import heapq
import itertools
import logging
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

log = logging.getLogger("ftis_edge.peers.intake")    # quarantine is intake's verdict: logged under its name

MAX_PEERS = 512                # peers the book holds (PeerBook.get evicts beyond it)


# Bin edges of a peer's per-sample KL histogram (``PeerStats.kl_counts``): bin k is [edge k, edge k+1),
# the last [10, inf). Decades below the filter's thresholds, and 0.05 / 0.5 / 5 among them, so the
# share of a peer's samples above any of those g reads straight off the counts.
KL_EDGES = (0.0, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)


def kl_bin(kl: float) -> int:
    """The KL_EDGES bin of one sample's k3 KL (k3 is >= 0; a rounding below 0 counts in bin 0)."""
    return max(0, bisect.bisect_right(KL_EDGES, kl) - 1)


@dataclass
class PeerStats:
    node_id: str
    model: str = ""
    model_fp: str = ""
    tokenizer: str = ""
    last_seen: float = 0.0
    sent: int = 0                    # rollouts that reached us from this peer
    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: dict = field(default_factory=lambda: defaultdict(int))
    samples_used: int = 0
    filtered: int = 0
    kl_sum: float = 0.0
    kl_counts: list = field(default_factory=lambda: [0] * len(KL_EDGES))   # its samples' KL, by KL_EDGES bin
    is_weight_sum: float = 0.0
    grader_timeouts: int = 0
    grade_s: float | None = None     # grading seconds per answer of its rollouts (moving average)
    signal_recent: deque = field(default_factory=deque)   # its last accepted groups: carried signal?
    reward_mismatches: int = 0       # claimed reward != our grade
    fingerprint_changes: int = 0     # model / tokenizer fingerprint changed mid-run
    fingerprint_change: str = ""     # the latest change, "tokenizer a -> b"
    recent: deque = field(default_factory=deque)   # last verdicts: None = accepted, else reason
    quarantined: bool = False
    quarantine_reason: str = ""

    def record_use(self, use) -> None:
        """Add one of this peer's samples that a step trained on (``batch.PeerSampleUse``)."""
        self.samples_used += 1
        if use.kl is not None:
            self.kl_sum += use.kl
            self.kl_counts[kl_bin(use.kl)] += 1
        if use.is_weight is not None:
            self.is_weight_sum += use.is_weight
        if use.dropped:
            self.filtered += 1

    def restore_use(self, d: dict) -> None:
        """The use counts of a snapshot (``as_dict``), so that a resumed node's cumulative peer
        figures continue the uninterrupted run's instead of starting again at its resume."""
        n = d.get("samples_used") or 0
        self.samples_used = n
        self.kl_sum = (d.get("kl_mean") or 0.0) * n
        self.is_weight_sum = (d.get("is_weight_mean") or 0.0) * n
        self.filtered = round((d.get("filter_rate") or 0.0) * n)
        hist = d.get("kl_hist") or {}
        if list(hist.get("edges") or ()) == list(KL_EDGES) and len(hist.get("counts") or ()) == len(KL_EDGES):
            self.kl_counts = [int(c) for c in hist["counts"]]

    def as_dict(self) -> dict:
        n = max(self.samples_used, 1)
        refused = sum(1 for v in self.recent if v is not None)
        return {
            "model": self.model, "model_fp": self.model_fp, "tokenizer": self.tokenizer,
            "last_seen": self.last_seen,
            "sent": self.sent, "accepted": self.accepted, "rejected": self.rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "acceptance_rate": self.accepted / self.sent if self.sent else None,
            "recent_reject_rate": refused / len(self.recent) if self.recent else None,
            "samples_used": self.samples_used,
            "kl_mean": self.kl_sum / n if self.samples_used else None,
            "is_weight_mean": self.is_weight_sum / n if self.samples_used else None,
            "filter_rate": self.filtered / n if self.samples_used else None,
            "kl_hist": {"edges": list(KL_EDGES), "counts": list(self.kl_counts)},
            "grader_timeouts": self.grader_timeouts, "reward_mismatches": self.reward_mismatches,
            "fingerprint_changes": self.fingerprint_changes,
            "fingerprint_change": self.fingerprint_change,
            "quarantined": self.quarantined, "quarantine_reason": self.quarantine_reason,
        }


def eviction_rank(p: PeerStats) -> tuple:
    """Lowest first out of a full book: quarantined last, then useful (its recent groups carried
    signal), then the most recently seen. A peer accepted with no signal is worth no more than a
    fresh id: kept before it, a book full of them evicted every honest newcomer before its
    first grade could be written down (issue 62 item 3)."""
    return (p.quarantined, any(p.signal_recent), p.last_seen)


class PeerBook:
    """Per-peer statistics and the quarantine rule.

    A peer is quarantined once, among its last ``window`` rollouts, at least
    ``quarantine_after`` were refused and they are at least ``max_reject_rate`` of them. A
    rate over a window, not a run of consecutive failures: "4 bad + 1 good" forever is 80 %
    refused and gets quarantined. Quarantine lasts for the run (and across --resume).

    The book holds at most ``max_peers`` entries (every sender gets one before any check, so
    a flood of fresh ids would otherwise grow it, each round record and each checkpoint
    without bound): a new sender beyond the cap evicts the longest-idle sender whose recent
    groups carried no signal (``eviction_rank``), else the longest-idle useful one; quarantined
    peers go last (their quarantine is what the book is for). ``evicted`` counts them. The order is a heap, so that a flood of
    10,000 fresh ids a round costs a logarithm each, not a scan of the book each; what an
    evicted id loses is its counts and its standing, not its place in the grading
    (``grading.GradingRing`` keeps that for no id).
    """

    def __init__(self, quarantine_after: int = 5, window: int = 20, max_reject_rate: float = 0.5,
                 max_peers: int = MAX_PEERS):
        if quarantine_after < 1 or window < 1 or not 0.0 < max_reject_rate <= 1.0:
            raise ValueError("PeerBook: quarantine_after >= 1, window >= 1, 0 < max_reject_rate <= 1")
        if max_peers < 1:
            raise ValueError("PeerBook: max_peers >= 1")
        self.max_peers = max_peers
        self.evicted = 0
        self.quarantine_after = quarantine_after
        self.window = window
        self.max_reject_rate = max_reject_rate
        self.peers: dict[str, PeerStats] = {}
        # (rank, seq, id) entries: every peer has one at or below its rank (ranks only grow, but
        # for losing its signal, which pushes a new one); a stale one is re-pushed when popped
        self._order: list[tuple] = []
        self._seq = itertools.count()

    def get(self, node_id: str) -> PeerStats:
        if node_id not in self.peers:
            if len(self.peers) >= self.max_peers:
                self._evict_one()
            p = self.peers[node_id] = PeerStats(node_id=node_id, recent=deque(maxlen=self.window),
                                                signal_recent=deque(maxlen=self.window))
            self._push(p)
        return self.peers[node_id]

    def _push(self, p: PeerStats) -> None:
        if len(self._order) > 2 * self.max_peers + 64:       # compact: drop what was evicted or re-pushed
            self._order = [(eviction_rank(q), next(self._seq), q.node_id) for q in self.peers.values()]
            heapq.heapify(self._order)
        heapq.heappush(self._order, (eviction_rank(p), next(self._seq), p.node_id))

    def _evict_one(self) -> None:
        while True:
            rank, _, node_id = heapq.heappop(self._order)
            p = self.peers.get(node_id)
            if p is None:
                continue                 # evicted before
            now = eviction_rank(p)
            if now == rank:
                break
            if now > rank:               # seen or accepted since: its place moved back
                heapq.heappush(self._order, (now, next(self._seq), node_id))
        del self.peers[node_id]
        self.evicted += 1

    def reject(self, node_id: str, reason: str, charged: bool = True) -> None:
        """Count a refusal; ``charged=False``: not the peer's doing, it counts towards no quarantine
        (and a peer evicted since it sent is not booked again for it: that would evict another)."""
        if not charged and node_id not in self.peers:
            return
        p = self.get(node_id)
        p.rejected += 1
        p.rejected_by_reason[reason] += 1
        if p.quarantined or not charged:    # refused, but it counts towards nothing
            return
        p.recent.append(reason)
        refused = [v for v in p.recent if v is not None]
        if len(refused) >= self.quarantine_after and len(refused) >= self.max_reject_rate * len(p.recent):
            top = ", ".join(f"{k} {n}" for k, n in Counter(refused).most_common(3))
            self.quarantine(node_id, f"{len(refused)} of its last {len(p.recent)} rollouts refused ({top})")

    def accept(self, node_id: str, signal: bool = True) -> None:
        """Count an accepted rollout; ``signal``: its re-graded rewards differ (it can teach)."""
        p = self.get(node_id)
        useful = any(p.signal_recent)
        p.accepted += 1
        p.recent.append(None)
        p.signal_recent.append(bool(signal))
        if useful and not any(p.signal_recent):     # its rank fell: a new place in the order
            self._push(p)

    def quarantine(self, node_id: str, reason: str) -> None:
        p = self.get(node_id)
        if not p.quarantined:
            p.quarantined, p.quarantine_reason = True, reason
            log.warning("quarantined peer %s: %s", node_id, reason)

    def note_fingerprints(self, node_id: str, r: Rollout) -> None:
        """Record the model and tokenizer a peer claims; a change mid-run is logged and counted."""
        p = self.get(node_id)
        changes = [f"{what} {old} -> {new}" for what, old, new in
                   (("model", p.model_fp, r.model_fp), ("tokenizer", p.tokenizer, r.tokenizer_fp))
                   if old and new != old]
        if changes:
            p.fingerprint_changes += 1
            p.fingerprint_change = "; ".join(changes)
            log.warning("peer %s changed fingerprint mid-run: %s (%d changes so far)",
                        node_id, p.fingerprint_change, p.fingerprint_changes)
        p.model, p.model_fp, p.tokenizer = r.model_name, r.model_fp, r.tokenizer_fp

    def snapshot(self) -> dict:
        return {nid: p.as_dict() for nid, p in self.peers.items()}
