"""Peer-chosen strings cannot reach the terminal as control sequences (text_safety, called at
intake; the dashboard escapes what it reads as well), and extreme values plot without a crash.
Real pieces: the intake and wire of test_intake, logging as a node sets it up, the real
dashboard under Textual's pilot."""
from __future__ import annotations

import logging
from pathlib import Path

import orjson

from ftis_edge.run.logs import setup_logging
from ftis_edge.common.text_safety import terminal_safe
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed, PeersTable
from testkit.peers import intake_for, rollout, send
from dashboard import ROUNDS, append, live_copy, screen_text
OSC52 = "\x1b]52;c;ZXZpbA==\x07"                       # write "evil" to the clipboard
CSI = "\x1b[2J\x1b[H"                                  # clear the screen, cursor home
BIDI = "\u202egnp.exe"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def test_terminal_safe_escapes_control_and_bidi_characters_only():
    assert terminal_safe("smol-node · SmolLM2-135M ≤ ünïcode") == "smol-node · SmolLM2-135M ≤ ünïcode"
    assert terminal_safe(OSC52) == "\\x1b]52;c;ZXZpbA==\\x07"
    assert terminal_safe(CSI + "x\ty\n\x9b\x7f") == "\\x1b[2J\\x1b[Hx\\x09y\\x0a\\x9b\\x7f"
    assert terminal_safe(BIDI) == "\\u202egnp.exe"
    assert terminal_safe("a\u2066b\u2069\u200f") == "a\\u2066b\\u2069\\u200f"
    assert terminal_safe(None) is None and terminal_safe(3) == 3


def live_run(tmp_path: Path, peers: dict) -> Path:
    run = live_copy(tmp_path)
    append(run, dict(ROUNDS[-1], round=ROUNDS[-1]["round"] + 1, peers=peers))
    return run


async def test_peer_strings_are_escaped_at_intake_in_the_log_and_on_the_dashboard(smol, task, tmp_path, capfd):
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    setup_logging(node_dir, console=True)                  # as a headless node logs
    try:
        evil = "mallory" + CSI
        intake = intake_for(smol, task)
        first, _ = rollout(smol, task, node=evil, model_name="Smol" + OSC52)
        second, _ = rollout(smol, task, node=evil, model_name="Smol" + OSC52)
        second.model_fp = "fp2" + OSC52                     # as decoded from the wire: any UTF-8
        send(intake, first, sender=evil)
        send(intake, second, sender=evil)                   # a fingerprint change: a warning line
    finally:
        for name in ("ftis_edge", "relay"):
            for h in list(logging.getLogger(name).handlers):
                logging.getLogger(name).removeHandler(h)
                h.close()
    console = capfd.readouterr().err
    log = (node_dir / "node.log").read_text(encoding="utf-8")
    for text in (console, log):
        assert "changed fingerprint mid-run" in text
        assert "mallory\\x1b[2J\\x1b[H" in text and "fp2\\x1b]52;c;ZXZpbA==\\x07" in text
        assert not any(ch in text for ch in RAW)
    snapshot = intake.book.snapshot()
    assert list(snapshot) == ["mallory\\x1b[2J\\x1b[H"]      # one peer, under its escaped id
    assert snapshot["mallory\\x1b[2J\\x1b[H"]["model"] == "Smol\\x1b]52;c;ZXZpbA==\\x07"

    # the dashboard, on that snapshot and on a raw string an older node might have recorded
    peers = dict(snapshot, **{"raw" + OSC52 + BIDI: {"model": CSI, "sent": 1, "quarantined": False}})
    app = DashboardApp(live_run(tmp_path, peers), poll_interval=0.05)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        table = app.query_one(PeersTable)
        cells = [table.get_cell(k.value, key).plain for k in table.rows for key, _ in PeersTable.COLUMNS]
        detail = app.query_one("#peer-detail", Packed).text
        for text in (*cells, detail, screen_text(app)):
            assert not any(ch in text for ch in RAW), repr(text)
        assert any(c.startswith("raw\\x1b]52") for c in cells)
        assert "fingerprint changed 1x" in detail and "\\x1b]52" in detail


async def test_extreme_values_plot_on_every_tab(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [{"type": "start", "time": 1.0, "node_id": "n", "relay": None}]
    keys = [k for r in ROUNDS for k, v in r.items() if isinstance(v, float)]
    for i, big in enumerate((1e308, -1e308, 1.7e308, 5e-324, -1e300), start=1):
        records.append({"type": "round", "round": i, "time": 1.0 + i, **{k: big for k in keys}})
    (run / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    app = DashboardApp(run, poll_interval=0.05)
    async with app.run_test(size=(160, 50)) as pilot:
        for tab in "1234567":
            await pilot.press(tab)
            await pilot.pause()
        assert app.return_code is None and "reward" in screen_text(app)
