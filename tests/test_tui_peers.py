"""Thousands of peers: the Peers tab lists the most recently seen PeersTable.MOST of them and
says so (the real dashboard under the pilot, a real PeerBook's snapshot; the timing is
benchmarks/bench_tui_peers.py)."""
from __future__ import annotations

from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import PeersTable
from testkit.peer_runs import make_run


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


def test_a_peers_kl_is_shown_with_its_meaning_against_the_f_gate():
    """Issue 50: the Peers tab showed "1391.0173" with no scale. Now the number says what it means
    against the run's F- gate (train.kl_threshold, 5 by default)."""
    from ftis_edge.tui.widgets import kl_words
    assert kl_words(1391.0173, 5.0) == "1391 278x gate"        # another model: its weak samples are dropped
    assert kl_words(7.5, 5.0) == "7.50 past gate"
    assert kl_words(1.3, 5.0) == "1.30 near"
    assert kl_words(0.004, 5.0) == "0.00 like ours"
    assert kl_words(None, 5.0) == "–"
