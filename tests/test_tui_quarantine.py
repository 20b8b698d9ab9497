"""The Peers tab shows why a peer was quarantined and that its fingerprint changed, from a real
PeerBook's snapshot appended to the recorded run, in the real dashboard under Textual's pilot."""
from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from ftis_edge.peers.book import PeerBook
from ftis_edge.metrics.records import read_rounds
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed, PeersTable
from ftis_edge.rollout.wire import Rollout

FIXTURE = Path(__file__).resolve().parent / "data" / "recorded_run"


def _book() -> PeerBook:
    book = PeerBook(quarantine_after=5, window=20, max_reject_rate=0.5)
    for fp in ("aaaa", "bbbb"):               # a tokenizer swap mid-run
        book.note_fingerprints("mallory", Rollout(node_id="mallory", swarm="s", task="arith", prompt_id="x",
                                                  completions=[], model_fp="m1", tokenizer_fp=fp))
    for _ in range(4):
        for _ in range(4):
            book.reject("mallory", "token_text_mismatch")
        book.accept("mallory")
    return book


async def test_quarantine_reason_and_fingerprint_change_in_the_peers_tab(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    rounds = read_rounds(run)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    record = dict(rounds[-1], round=rounds[-1]["round"] + 1, peers=_book().snapshot())
    (run / "metrics.jsonl").write_bytes(b"".join(ln for ln in lines if b'"type":"stop"' not in ln)
                                        + orjson.dumps(record) + b"\n")
    app = DashboardApp(run, poll_interval=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        assert app.query_one(PeersTable).get_cell("mallory", "quarantined").plain == "yes"
        detail = " ".join(app.query_one("#peer-detail", Packed).text.split())
        assert "quarantined: 5 of its last 6 rollouts refused (token_text_mismatch 5)" in detail
        assert "fingerprint changed 1x: tokenizer aaaa -> bbbb" in detail
