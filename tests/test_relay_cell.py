"""The dashboard's relay cell is as fresh as the node's own log: it reads progress.json, which the
node's relay watcher updates within a second of a change, not the last round record (minutes old
on a slow node)."""
from __future__ import annotations

import time

import orjson
import pytest

from ftis_edge.store.progress import PROGRESS_FILE, read_progress
from ftis_edge.tui import DashboardApp
from procs import rounds_of, start_node, wait_for, write_config
from dashboard import FAST, cell, live_copy
from dashboard import wait_for as wait_on_screen


def write_progress(run, relay: dict) -> None:
    (run / PROGRESS_FILE).write_bytes(orjson.dumps({"pid": 1, "phase": "training", "since": time.time(),
                                                    "time": time.time(), "round": 99, "relay": relay}))


async def test_the_relay_cell_follows_progress_not_the_round_record(tmp_path):
    run = live_copy(tmp_path)                  # its last round record says: connected
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert cell(app, "relay").startswith("ok")
        write_progress(run, {"state": "unreachable", "reason": "no answer for 4 s", "latency_ms": None})
        await wait_on_screen(pilot, lambda: cell(app, "relay") == "down")
        assert "relay unreachable" in app.sub_title
        write_progress(run, {"state": "connected", "reason": None, "latency_ms": 7})
        await wait_on_screen(pilot, lambda: cell(app, "relay") == "ok 7ms")


@pytest.mark.slow       # a real node/relay process end to end: CI's slow tier (README command < 20 min)
@pytest.mark.model
@pytest.mark.timeout(600)
def test_a_real_node_says_the_relay_died_within_seconds_not_a_round(tmp_path, relay):
    r = relay()
    cfg = write_config(tmp_path, "slow", node={"rounds": 50, "checkpoint_every": 1000}, eval={"every": 0},
                       swarm={"max_wait_s": 0.2})
    run = tmp_path / "slow"
    node = start_node(cfg, "--relay", r.address)
    try:
        assert wait_for(lambda: ((read_progress(run) or {}).get("relay") or {}).get("state") == "connected", 300)
        assert wait_for(lambda: len(rounds_of(run)) >= 1, 300)
        r.kill()
        killed = time.time()
        assert wait_for(lambda: ((read_progress(run) or {}).get("relay") or {}).get("state") not in
                        (None, "connected"), 60)
        seen = time.time() - killed
        records = rounds_of(run)
        # the node's own words in progress.json came before (or without) a round record saying so
        assert seen < 30 and (records[-1].get("relay/state") == "connected" or seen < records[-1]["time"] - killed
                              + 1), (seen, records[-1].get("relay/state"))
    finally:
        node.kill()
        node.wait()
