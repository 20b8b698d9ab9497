"""What a round cost this node: process CPU-seconds by phase, own tokens, and what peers saved.

Process CPU time (``time.process_time``: user + system, every thread of this process), not
wall-clock, so the figures hold on a machine shared with other jobs. The grader worker is a
separate process (tasks/grader.py): its answer comparisons are not in ``cpu/grade_s``, which
counts this process's side of grading (format checks, pre-filters, the requests).

Totals are cumulative over the run and travel in the checkpoint, so a resumed run goes on
counting where it stopped.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

PHASES = ("gen", "grade", "intake", "train", "sync")   # cpu/<phase>_s in the round record


class CpuClock:
    """One round's process CPU-seconds, by phase (``with clock.measure("gen"): ...``)."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._start = time.process_time()

    @contextmanager
    def measure(self, name: str):
        """Add the CPU time of the ``with`` block to phase ``name``."""
        t0 = time.process_time()
        try:
            yield
        finally:
            self.seconds[name] += time.process_time() - t0

    def round_s(self) -> float:
        """Everything since the round began, the phases and what lies between them."""
        return time.process_time() - self._start


@dataclass
class ComputeTotals:
    """Cumulative over the run (checkpointed)."""
    tokens: int = 0             # own completion tokens generated
    cpu_s: float = 0.0          # process CPU-seconds
    groups: int = 0             # groups trained on (own + peers')
    replaced: float = 0         # of those, peer groups that stood in for own generation (batch fill),
    #                             each counted at what it weighed in the step (issue 65: 0 for none)

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | None) -> "ComputeTotals":
        """From a checkpoint; one written before accounting existed starts from zero."""
        return cls(**{k: v for k, v in (state or {}).items() if k in cls.__dataclass_fields__})


def round_compute(clock: CpuClock, totals: ComputeTotals, *, tokens: int, own_groups: int,
                  peer_groups: int, fill: bool, saved: float | None = None) -> dict:
    """The round's accounting keys; adds the round to ``totals``.

    With batch fill on (``fill``), every peer group in the batch stood in for a group this
    node would otherwise have generated; with peers' groups on top of a full own batch, none did.
    ``saved``: how many own groups they were worth, each peer group at the mean weight its
    samples carried in the step (``batch.group_weights``): a group the bound let weigh 1/16, or
    one with no signal, saved (almost) nothing. None: every peer group counts whole.
    """
    cpu = clock.round_s()
    groups = own_groups + peer_groups
    saved = (peer_groups if saved is None else min(float(saved), peer_groups)) if fill else 0
    totals.tokens += tokens
    totals.cpu_s += cpu
    totals.groups += groups
    totals.replaced += saved
    record = {f"cpu/{p}_s": s for p, s in clock.seconds.items()}
    record.update({
        "cpu/round_s": cpu, "cpu/total_s": totals.cpu_s, "gen/tokens_total": totals.tokens,
        "groups/own": own_groups,
        "peers/share": peer_groups / groups if groups else None,
        "peers/saved_groups": saved if fill else None,
        "peers/saved_frac": totals.replaced / totals.groups if fill and totals.groups else None,
    })
    return record


def saved_phrase(record: dict) -> str | None:
    """The round's swarm contribution in words, for the headless line and the dashboard:
    "swarm supplied 3 of 4 groups; 58% of your generation saved so far" (batch fill), "swarm
    supplied 3 of 4 groups, worth 0.2 of yours; ..." when they weighed less than own groups in
    the step, "no peer of your kind: you generate 4 of 4 groups" (swarm.fill = "kin" without
    kin), or "swarm added 12 groups to your 4" (peers on top); None when there is nothing to say."""
    own, peers = record.get("groups/own"), record.get("peers/groups_used")
    if not isinstance(own, int) or not isinstance(peers, int):
        return None
    kin = record.get("kin/said")
    if isinstance(kin, str) and not record.get("kin/peers"):
        return kin
    saved = record.get("peers/saved_frac")
    if isinstance(saved, (int, float)):
        worth = record.get("peers/saved_groups")
        counted = (f", worth {worth:.1f} of yours" if isinstance(worth, (int, float)) and peers
                   and worth < peers - 0.05 else "")
        return (f"swarm supplied {peers} of {own + peers} groups{counted}; "
                f"{100 * saved:.0f}% of your generation saved so far")
    return f"swarm added {peers} groups to your {own}"
