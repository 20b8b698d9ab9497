"""Nodes that run on past R (H7, docs/results.md): in a swarm arm, every node but one (the slowest,
H7's Gemma node: ``SwarmBatch.run_on_until``) keeps running and sending past round R, with a
checkpoint every round, until that node has its stop record; each is then scored on its round-R
checkpoint. (H6's seed 2: the fast SmolLM2 nodes stopped at R first and left the Gemma node
topping up its last rounds with its own groups.)

What run.py keeps of such a node, beside its ordinary run directory::

    RUN_DIR/scored/config.toml        the run's config: scored/ is a run directory of its own,
    RUN_DIR/scored/checkpoints/round-NNNNNN/
                                      holding the round-R checkpoint, hard-linked aside as soon as
                                      the node writes it (the node keeps only its newest two);
    RUN_DIR/scored/export/            its export (`ftis-edge export --latest`), which the evals score
    RUN_DIR/scored-round.json         {"round": R, ...}: the node is done. Written once the node no
                                      longer runs and the arm's slowest node has its "steps" stop;
                                      the analysis then reads its rounds 1..R (analyze.load_run).

A node stopped by the runner past R stops with reason "signal", not "steps": for these nodes the
mark, not the stop record, says the run is finished.

Which node is slowest is known beforehand only where one node is much slower than the rest (H7's
Gemma node). H8's claim failed on a pair whose peers stopped at R first, leaving it topping up
alone (issue 65 item 5), so ``run_on_until = "slowest"`` (batches.SwarmBatch) runs every node of
a swarm arm on past R until *every* node of the arm has reached round R (its round-R checkpoint
kept, ``reached``), whichever that turns out to be; each is then stopped and scored at R.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from experiments.repro import records
from ftis_edge.common import atomic
from ftis_edge.store import checkpoint, progress

FACTOR = 4                      # rounds limit = FACTOR x R: a bound for a node whose runner died, never reached in H6's pace
SNAPSHOT = "scored"
MARK = "scored-round.json"


def limit(rounds: int) -> int:
    """The rounds a run-on node is configured with (it is stopped long before, at the slowest's stop)."""
    return FACTOR * rounds


def snapshot_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SNAPSHOT


def kept(run_dir: Path, round_: int) -> bool:
    """Whether the round-R checkpoint has been put aside."""
    return round_ in checkpoint.complete(snapshot_dir(run_dir))


def keep(run_dir: Path, round_: int) -> bool:
    """Put the node's round-R checkpoint aside once it exists (hard links: no copy, and the node's
    later removal of its own copy leaves these); True when it is kept. The checkpoint directory
    appears whole (the node renames it into place) with its manifest in it, so one that has a
    manifest is complete; one removed under our feet (two rounds later) leaves nothing half-made."""
    if kept(run_dir, round_):
        return True
    src = checkpoint.dir_of(run_dir) / f"round-{round_:06d}"
    if not (src / checkpoint.MANIFEST).is_file():
        return False

    def write(tmp: Path) -> None:
        target = checkpoint.dir_of(tmp) / src.name
        target.mkdir(parents=True)
        for f in src.iterdir():
            try:
                os.link(f, target / f.name)
            except OSError:             # another file system: copy
                shutil.copy2(f, target / f.name)
        shutil.copy2(Path(run_dir) / "config.toml", tmp / "config.toml")

    try:
        atomic.write_dir(snapshot_dir(run_dir), write)
    except OSError:                     # removed while we linked it: tried again next poll, or lost
        return False
    return kept(run_dir, round_)


def scored_round(run_dir: Path) -> int | None:
    """R when the node is done and scored on its round-R weights (the mark; also in docs/runs,
    plain or gzip-compressed), else None."""
    data = records.read_bytes(Path(run_dir) / MARK)
    if data is None:
        return None
    r = json.loads(data).get("round")
    return r if isinstance(r, int) and not isinstance(r, bool) and r >= 1 else None


def mark(run_dir: Path, round_: int, until: str) -> None:
    """The node is done: it ran on past R until UNTIL stopped, and is scored on round R."""
    atomic.write_text(Path(run_dir) / MARK, json.dumps({
        "round": round_, "until": until,
        "why": f"ran on past round {round_} until {until} had its stop record; "
               f"scored on its round-{round_} checkpoint ({SNAPSHOT}/)"}) + "\n")


def reset(run_dir: Path) -> None:
    """A fresh start: no round-R checkpoint or mark of an older run is kept."""
    shutil.rmtree(snapshot_dir(run_dir), ignore_errors=True)
    (Path(run_dir) / MARK).unlink(missing_ok=True)


def reached(run_dir: Path, round_: int) -> bool:
    """Whether a node of the arm has reached round R: its round R kept aside (or the node scored),
    or its checkpoints already past R (a round R that went by unwatched: it will not come back)."""
    run_dir = Path(run_dir)
    return (kept(run_dir, round_) or scored_round(run_dir) is not None
            or min(checkpoint.complete(run_dir), default=0) > round_)


def rounds_to_score(run: list[dict], run_dir: Path) -> list[dict]:
    """The round records that count: rounds 1..R of a run-on node, all of any other run."""
    r = scored_round(run_dir)
    return run if r is None else [rec for rec in run if rec.get("round", 0) <= r]


def in_round(run_dir: Path, pid: int) -> int | None:
    """The round process PID is in, by its progress.json (a file left by an earlier process of the
    run says nothing: None). The node writes it once the round has begun, past its loop's check."""
    report = progress.read_progress(run_dir)
    if not report or report.get("pid") != pid or not isinstance(report.get("round"), int):
        return None
    return report["round"]


class Watch:
    """run.py's side, polled while a seed trains: put each run-on node's round-R checkpoint aside,
    stop the node (SIGINT: it finishes its round, checkpoints and writes its stop record) once its
    arm's slowest node is done, and mark it done once it no longer runs. ``nodes``: run-on node
    name -> (its run directory, the run directory of the node it waits for, or a tuple of those of
    every other node of its arm: it waits for all of them); ``done(run_dir)``: whether that node
    has finished (run.finished; for a tuple, ``reached`` round R)."""

    def __init__(self, nodes: dict[str, tuple[Path, Path]], round_: int, done):
        self.nodes, self.round, self.done = nodes, round_, done
        self.asked: set[str] = set()
        self.lost: set[str] = set()

    def poll(self, procs: dict) -> list[str]:
        """One look; returns what it did, one line each (for the runner's log)."""
        said = []
        for rd, _ in self.nodes.values():   # every round R first: one node's wait may end on another's
            if scored_round(rd) is None:
                keep(rd, self.round)
        for name, (rd, until) in self.nodes.items():
            if scored_round(rd) is not None:
                continue
            has_r = keep(rd, self.round)
            if not has_r and name not in self.lost and min(checkpoint.complete(rd), default=0) > self.round:
                self.lost.add(name)
                said.append(f"{name}: its round-{self.round} checkpoint was not kept (it went by with no runner "
                            f"watching): it cannot be scored as registered; rerun the arm from scratch")
            waits = until if isinstance(until, tuple) else (until,)
            if name in self.lost or not all(self.done(u) for u in waits):
                continue
            who = waits[0].name if len(waits) == 1 else f"every node of its arm reached round {self.round}:"
            p = procs.get(name)
            if p is not None and p.poll() is None:
                # past R, or in round R itself (a node slower than the one it waits for): a SIGINT
                # now ends it after round R, whose checkpoint the stop writes
                if name not in self.asked and (has_r or in_round(rd, p.pid) == self.round):
                    os.killpg(p.pid, signal.SIGINT)
                    self.asked.add(name)
                    said.append(f"{name}: {who if len(waits) > 1 else who + ' has stopped,'} stopping it "
                                + (f"(round {self.round} kept)" if has_r else f"after its round {self.round}"))
                continue
            if has_r:
                mark(rd, self.round, waits[0].name if len(waits) == 1 else "the slowest of its arm")
                said.append(f"{name}: done, scored on its round-{self.round} checkpoint")
        return said
