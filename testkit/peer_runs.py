"""A run directory whose round records carry N peers: the recorded run's rounds (tests/data/
recorded_run), with a real PeerBook's snapshot of N senders in place of their peers. The dashboard's
Peers-tab test (tests/test_tui_peers.py) and its timing (benchmarks/bench_tui_peers.py) read it."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from ftis_edge.metrics.records import read_metrics, round_records
from ftis_edge.peers.book import PeerBook

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "recorded_run"


def peer_snapshot(n: int) -> dict:
    """A real PeerBook after n senders each sent one rollout (half accepted); its cap raised to
    n (a node's book holds MAX_PEERS): what is tested and measured is the dashboard."""
    book = PeerBook(quarantine_after=5, max_peers=max(n, 1))
    for i in range(n):
        node = f"sybil-{i:05d}"
        (book.accept if i % 2 else book.reject)(node, *(() if i % 2 else ("decode",)))
        book.get(node).sent = 1
        book.get(node).last_seen = 1_700_000_000.0 + i
    return book.snapshot()


def make_run(root: Path, peers: int, rounds: int) -> tuple[Path, dict]:
    """``root/run`` with ``rounds`` rounds that each carry ``peers`` peers, and the next round's record."""
    run = root / "run"
    shutil.copytree(FIXTURE, run)
    records = read_metrics(FIXTURE)
    start = records[0]
    last = round_records(records)[-1]
    snap = peer_snapshot(peers)
    lines = [orjson.dumps(start)]
    for i in range(1, rounds + 1):
        lines.append(orjson.dumps(dict(last, round=i, peers=snap)))
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return run, dict(last, round=rounds + 1, peers=snap)
