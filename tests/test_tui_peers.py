"""Thousands of peers: the Peers tab lists the most recently seen PeersTable.MOST of them and
says so (the real dashboard under the pilot, a real PeerBook's snapshot; the timing is
benchmarks/bench_tui_peers.py)."""
from __future__ import annotations

from benchmarks.bench_tui_peers import make_run
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import PeersTable


async def test_the_peers_tab_lists_the_most_recent_peers_and_says_how_many(tmp_path):
    run, _ = make_run(tmp_path, peers=1000, rounds=1)
    app = DashboardApp(run, poll_interval=0.05)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        table = app.query_one(PeersTable)
        assert table.row_count == PeersTable.MOST < 1000
        shown = {k.value for k in table.rows}
        # the newest: make_run's peer i was last seen at t0 + i
        assert shown == {f"sybil-{i:05d}" for i in range(1000 - PeersTable.MOST, 1000)}
        line = " ".join(app.query_one("#peers-shown").text.split())
        assert line == f"1000 peers (0 quarantined): the {PeersTable.MOST} most recently seen are listed"
        assert app.query_one("#hl-peers").visual.plain.split("\n")[1] == "1000"
