"""The dashboard under Textual's real pilot, on a recorded run (tests/data/recorded_run): the run,
a live copy of it, and how a test reads what the app shows and waits for it to change."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import orjson
from textual.widgets import Static

from ftis_edge.metrics.records import read_metrics, round_records
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "data" / "recorded_run"
RECORDS = read_metrics(FIXTURE)
ROUNDS = round_records(RECORDS)
FAST = 0.05          # poll interval for tests: the app's timer, just quicker


def plain(widget) -> str:
    """What a Static or Packed line shows, as plain text with runs of spaces as one."""
    text = widget.text if isinstance(widget, Packed) else widget.visual.plain
    return text if "\n" in text else " ".join(text.split())


def cell(app: DashboardApp, key: str) -> str:
    """The value line of a headline cell."""
    return plain(app.query_one(f"#hl-{key}", Static)).split("\n")[1]


def screen_text(app: DashboardApp) -> str:
    """The whole screen as text, exactly as the terminal would show it."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def plotted_rounds(app: DashboardApp, panel_id: str) -> list[list]:
    """The x values (rounds) of each line in a panel's plot, as handed to plotext."""
    return app.query_one(f"#{panel_id} PlotextPlot").plt._active.monitor.x


def live_copy(tmp_path: Path) -> Path:
    """The fixture without its stop record: a node that is still running."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(b"".join(ln for ln in lines if b'"type":"stop"' not in ln))
    return run


def append(run: Path, record: dict | bytes) -> None:
    data = record if isinstance(record, bytes) else orjson.dumps(record) + b"\n"
    with open(run / "metrics.jsonl", "ab") as fh:
        fh.write(data)


async def wait_for(pilot, condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)
