"""The run-level progress on the Overview's round line ("round 5 of 6 … 4 done (67%) · ~22 min
left"): a real run directory (the recorded run, 4 of its 6 rounds done) with a real
ProgressReport, read by the real app under Textual's pilot at 80x24."""
from __future__ import annotations

import re
import time

from ftis_edge.store import progress as phases
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed
from dashboard import FAST, ROUNDS, append, live_copy, wait_for

COUNTER = re.compile(r"(\d+)(?: of (\d+) rounds)? done \((\d+)%\)")


def round_line(app: DashboardApp) -> str:
    return " ".join(app.query_one("#round-progress", Packed).text.split())


def counted(text: str, total: int) -> tuple[int, int]:
    """(rounds done, percent) as the line prints them; the percent must be the counter's."""
    m = COUNTER.search(text)
    assert m, text
    done, pct = int(m.group(1)), int(m.group(3))
    assert m.group(2) is None or int(m.group(2)) == total, text
    assert pct == (100 if done == total else min(99, round(100 * done / total))), text
    return done, pct


async def test_run_progress_agrees_with_its_counter_and_fits_80x24(tmp_path):
    run = live_copy(tmp_path)                      # 4 rounds recorded of node.rounds = 6, still running
    total, last = 6, ROUNDS[-1]
    report = phases.ProgressReport(run, min_interval=0.0)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        report.round_started(last["round"] + 1)
        report.phase(phases.GENERATING, done=1, total=8)
        await wait_for(pilot, lambda: "generating" in round_line(app))
        text = round_line(app)
        assert text.startswith(f"round {last['round'] + 1} of {total}: generating 1/8"), text
        assert counted(text, total) == (4, 67)     # round 5 in progress, 4 done: not 5/6, not the bar's %
        left = re.search(r"~(\d+) min left", text)
        typical = sum(r["time/round_s"] for r in ROUNDS[-5:]) / len(ROUNDS[-5:])
        assert left and abs(int(left.group(1)) * 60 - 2 * typical) <= 60 + 5, text   # 2 rounds to go
        assert app.query_one("#round-progress").region.height == 2, text     # beside the bar, no new row

        # round 5 lands: the counter and its percentage move together
        append(run, dict(last, round=last["round"] + 1, time=time.time()))
        report.round_started(last["round"] + 2)
        report.phase(phases.TRAINING, samples=16)
        await wait_for(pilot, lambda: f"round {last['round'] + 2} of {total}" in round_line(app))
        assert counted(round_line(app), total) == (5, 83)

        # the last round and the stop record: all done, 100 %, no time left to show
        append(run, dict(last, round=total, time=time.time()))
        append(run, {"type": "stop", "round": total, "reason": "steps", "time": time.time()})
        await wait_for(pilot, lambda: "100%" in round_line(app))
        text = round_line(app)
        assert f"{total} of {total} rounds done (100%)" in text and "left" not in text, text
        assert counted(text, total) == (total, 100)
        assert app.query_one("#round-progress").region.height == 1, text
