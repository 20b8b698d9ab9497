"""The dashboard's held-out eval: the strip cell, the Overview's curve with its interval, the line
with base, best and the swarm guard; and an old run without evals (driven by Textual's real pilot).

The run is the recorded swarm run (tests/data/recorded_run, recorded before the eval existed), with
eval keys written into its round records by ``heldout.HeldOut.record`` from real eval records (the
H5 Gemma node's per-prompt greedy results, tests/data/h5_evals.json) and a real guard decision.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
from textual.widgets import Static

from ftis_edge.run.guard import SwarmGuard
from ftis_edge.run.heldout import EvalResult, HeldOut
from ftis_edge.metrics.records import read_metrics, read_rounds, round_records
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "data" / "recorded_run"
H5 = json.loads((HERE / "data" / "h5_evals.json").read_text())["runs"]
FAST = 0.05


def real(run: str, round_: int) -> EvalResult:
    return EvalResult.from_items(round_, H5[run]["items"][:64])


def run_with_evals(tmp_path: Path) -> tuple[Path, dict]:
    """The recorded run with a base eval before round 1, an eval at round 2 and one at the last
    round; the guard fired at the last one."""
    class NoTask:
        name = "arith"
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    records = read_metrics(run)
    rounds = round_records(records)
    h = HeldOut(NoTask(), None, None, every=2, prompts=0, max_new_tokens=8)
    guard = SwarmGuard("tok-gemma", "gemma")
    h.observe(real("alone-3", 0))
    rounds[0].update(h.base_record())
    h.observe(real("alone-3", rounds[1]["round"]))
    rounds[1].update(h.record(h.last))
    h.observe(real("ftis-3", rounds[-1]["round"]))
    last = rounds[-1]
    last.update(h.record(h.last))
    step = guard.observe(h.last, h.best, h.base, {"smol": {"tokenizer": "tok-smol", "model_fp": "smol"}})
    last.update({"swarm/guard": step.line, "swarm/guard_level": step.level})
    (run / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return run, last


def cell(app, key: str) -> str:
    return app.query_one(f"#hl-{key}", Static).visual.plain.split("\n")[1]


async def test_strip_curve_and_guard_line_show_the_held_out_eval(tmp_path):
    run, last = run_with_evals(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        acc, base = last["eval/accuracy"], last["eval/base_accuracy"]
        assert cell(app, "heldout") == f"{100 * acc:.0f}% (base {100 * base:.0f}%)"
        line = app.query_one("#held-out", Packed).text
        assert f"held-out {100 * acc:.0f}% [{100 * last['eval/accuracy_lo']:.0f}%–" in line
        assert f"at round {last['round']}" in line and f"base {100 * base:.0f}%" in line
        assert f"best {100 * last['eval/best_accuracy']:.0f}% (round {last['eval/best_round']}" in line
        assert "swarm guard: " in line and "McNemar p=" in line and "no peers of another tokenizer" in line
        # the curve starts at round 0 (the base model); its interval's ends are two more lines
        panel = app.query_one("#panel-accuracy")
        plotted = panel.query_one("PlotextPlot").plt._active.monitor.x
        rounds = read_rounds(run)
        rounds_with_eval = [0, rounds[1]["round"], last["round"]]
        assert rounds_with_eval in [list(xs) for xs in plotted]
        assert sum(list(xs) == rounds_with_eval for xs in plotted) == 3       # value, low end, high end
        stats = panel.query_one(".stats", Packed).text
        assert f"held-out {100 * acc:.0f}%" in stats and "training" in stats
        # the legend says why training and held-out can disagree
        legend = app.query_one("#tab-overview Static").visual.plain
        assert "held-out" in legend and "disagree" in legend


async def test_an_old_run_without_evals_still_shows(tmp_path):
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert cell(app, "heldout") == "–"
        assert not app.query_one("#held-out", Packed).display        # no line, no room taken
        assert "finished" in cell(app, "state")
        for tab in "1234567":
            await pilot.press(tab)
            await pilot.pause()


async def test_the_base_models_eval_shows_at_once_and_no_beat_is_said(tmp_path):
    """The base eval's own record (type base_eval, written when it ends) is on screen before round 1
    ends; with 5 prompts the line says they are too few to tell; an eval no better than the base is
    no "best"."""
    from ftis_edge.tui.state import held_out

    class NoTask:
        name = "arith"
    run = tmp_path / "run"
    run.mkdir()
    h = HeldOut(NoTask(), None, None, every=2, prompts=0, max_new_tokens=8)
    base = EvalResult(0, (True, False, False, False, False), (True,) * 5, (False,) * 5)
    h.observe(base)
    start = {"type": "start", "time": 1.0, "node_id": "n", "config": {"eval": {"every": 2}}}
    records = [start, {"type": "base_eval", "time": 2.0, "round": 0, **h.base_record()}]
    (run / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        assert cell(app, "heldout") == "base 20%"                 # was "–" until round 1's record
        line = app.query_one("#held-out", Packed).text
        assert "base model 20% on 5 prompts" in line and "too few held-out prompts to tell: 5 < 6" in line
    same = EvalResult(2, base.correct, base.format_ok, base.truncated)
    h.observe(same)
    with open(run / "metrics.jsonl", "ab") as fh:
        fh.write(orjson.dumps({"type": "round", "time": 3.0, "round": 2, **h.record(same)}) + b"\n")
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        ev = held_out(app.state)
        assert (ev.best_round, ev.beat_base) == (0, False)
        line = app.query_one("#held-out", Packed).text
        assert "no eval beat the base model yet" in line and "best" not in line.replace("beat", "")
