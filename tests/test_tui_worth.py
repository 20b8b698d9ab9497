"""The dashboard says in words what each kind of peer is worth to this node (issue 48.1)."""
from dashboard import FAST, ROUNDS, append, live_copy, plain, wait_for

from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import Packed
from ftis_edge.peers.worth import OTHER_TOKENIZER, SAME_MODEL, WorthBook, describe


async def test_the_relay_pane_says_what_each_kind_of_peer_is_worth(tmp_path):
    book = WorthBook()
    for r in range(1, 18):
        book.observe(r, [1.0] * 5 + [0.0] * 3, [(SAME_MODEL, [1.0, 0.0] * 4), (OTHER_TOKENIZER, [1.0, 0.0] * 4)],
                     [(SAME_MODEL, 1.0)] * 8 + [(OTHER_TOKENIZER, 0.7)] * 4 + [(OTHER_TOKENIZER, 0.0)] * 4)
    said = [describe(book.worth(k), own_groups=3, batch=4) for k in (SAME_MODEL, OTHER_TOKENIZER)]
    assert said[1].startswith("other tokenizer peers: not used since round 2")
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(200, 60)) as pilot:
        append(run, {**ROUNDS[-1], "round": ROUNDS[-1]["round"] + 1, "worth/said": said})
        shown = lambda: plain(app.query_one("#relay-status", Packed))     # noqa: E731
        await wait_for(pilot, lambda: "other tokenizer peers: not used" in shown())
        assert said[0].split(";")[0] in shown()
