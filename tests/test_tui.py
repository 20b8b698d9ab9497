"""The dashboard on a recorded run (tests/data/recorded_run), driven by Textual's real pilot.

Expected numbers are computed from the fixture file itself, so the tests hold if the
record is regenerated or replaced by a real run's record.
"""
from __future__ import annotations

import argparse
import os
import pty
import select
import shutil
import subprocess
import sys
import time

import orjson
import pytest
from textual.widgets import DataTable, Log, Static, TabbedContent

from ftis_edge import config
from ftis_edge.metrics import metric_keys
from ftis_edge.metrics.records import read_control
from ftis_edge.store.rundir import stop_words
from ftis_edge.tui import DashboardApp, watch
from ftis_edge.tui.format import age, text
from ftis_edge.tui.state import LogTail, RunState, relay_health
from ftis_edge.tui.widgets import kl_gate, kl_words, BREAK, HelpScreen, Packed, PeersTable, field, round_ticks
from dashboard import (FAST, FIXTURE, RECORDS, ROUNDS, append, cell, live_copy, plain, plotted_rounds,
                       screen_text, wait_for)
from procs import ROOT

LAST = ROUNDS[-1]


def mean_last10(key: str) -> float:
    vals = [r[key] for r in ROUNDS[-10:] if r.get(key) is not None]
    return sum(vals) / len(vals)


# ---- the fixture ---------------------------------------------------------------------------
def test_fixture_is_a_real_run_with_the_real_schema():
    """tests/data/recorded_run was recorded from real nodes (tests/data/make_recorded_run.py)."""
    assert RECORDS[0]["type"] == "start" and RECORDS[-1]["type"] == "stop" and len(ROUNDS) >= 4
    cfg = config.from_dict(RECORDS[0]["config"])                 # the node's config, valid today
    # settings added since the recording take their defaults; none recorded may change meaning
    for section, values in RECORDS[0]["config"].items():
        assert cfg.to_dict()[section] | values == cfg.to_dict()[section], section
    loaded = config.load(FIXTURE / "config.toml").to_dict()
    # recorded when a relative run_dir meant the current folder; now it means the file's folder
    assert loaded["node"].pop("run_dir") == str(FIXTURE / cfg.node.run_dir)
    assert loaded == {**cfg.to_dict(), "node": {k: v for k, v in cfg.to_dict()["node"].items() if k != "run_dir"}}
    for r in ROUNDS:
        assert metric_keys.unregistered(r) == [], r["round"]
    # what the dashboard shows: peers (one with another tokenizer), the IS stats, the relay
    assert len(LAST["peers"]) >= 2 and len({p["tokenizer"] for p in LAST["peers"].values()}) >= 2
    for peer in LAST["peers"].values():
        assert set(peer) <= set(metric_keys.PEER_FIELDS)
    for key in ("reward/peers", "sampling/importance_sampling_ratio/mean", "is/ess", "relay/latency_ms",
                "wire/bytes_per_token_in", "wire/bytes_per_token_out"):
        assert LAST[key] is not None, key


# ---- numbers on screen ---------------------------------------------------------------------
async def test_headline_shows_the_last_round():
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert cell(app, "round") == str(LAST["round"])
        assert cell(app, "reward") == f"{LAST['reward/own']:.2f}/{mean_last10('reward/own'):.2f}"
        assert cell(app, "accuracy") == f"{100 * LAST['accuracy/own']:.1f}%"
        assert cell(app, "dropped") == f"{100 * LAST['filter/dropped_frac']:.1f}%"
        assert cell(app, "speed") == str(round(LAST["gen/tok_s"]))
        quarantined = sum(p["quarantined"] for p in LAST["peers"].values())
        active = len(LAST["peers"]) - quarantined
        assert cell(app, "peers") == f"{active}" + (f" +{quarantined}q" if quarantined else "")
        assert cell(app, "relay") == f"ok {LAST['relay/latency_ms']:.0f}ms"
        assert cell(app, "state") == "finished"
        assert f"finished ({stop_words(RECORDS[-1]['reason'], short=True)})" in app.sub_title
        assert RECORDS[0]["node_id"] in app.title


async def test_panels_show_latest_values_and_means():
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()

        def stats(panel_id: str) -> str:
            return plain(app.query_one(f"#{panel_id} .stats", Packed))

        assert (f"own {LAST['reward/own']:.3f} (avg10 {mean_last10('reward/own'):.3f})"
                in stats("panel-reward"))
        assert f"peers {LAST['reward/peers']:.3f}" in stats("panel-reward")
        assert f"all {LAST['reward']:.3f}" in stats("panel-reward")
        assert f"training {100 * LAST['accuracy/own']:.1f}%" in stats("panel-accuracy")   # vs held-out
        assert stats("panel-filter") == (f"advantage ≤ 0 {100 * LAST['filter/adv_le0_frac']:.1f}% "
                                         f"KL > g {100 * LAST['filter/kl_gt_g_frac']:.1f}% "
                                         f"dropped (both) {100 * LAST['filter/dropped_frac']:.1f}%")
        assert stats("panel-is") == (f"w mean {LAST['sampling/importance_sampling_ratio/mean']:.3f} "
                                     f"truncated {100 * LAST['is/truncated_frac']:.1f}% "
                                     f"ESS {100 * LAST['is/ess']:.1f}%")
        assert f"KL {LAST['kl/mean']:.4f}" in stats("panel-kl")
        assert f"|ℓ−g| {LAST['sampling/sampling_logp_difference/mean']:.4f}" in stats("panel-kl")
        assert f"loss {LAST['loss']:.4f}" in stats("panel-loss")
        assert f"tok/s {round(LAST['gen/tok_s'])}" in stats("panel-toks")
        assert f"train {LAST['time/train_s']:.1f} s" in stats("panel-time")
        wire = plain(app.query_one("#speed-wire", Packed))
        assert f"out {LAST['wire/bytes_per_token_out']:.2f} B/tok" in wire
        assert f"in {LAST['wire/bytes_per_token_in']:.2f} B/tok" in wire
        assert f"OOM retries {LAST['memory/oom_retries']} total" in wire      # a cumulative count
        relay = plain(app.query_one("#relay-status", Packed))
        assert RECORDS[0]["relay"] in relay and "connected" in relay
        assert f"replayed {LAST['relay/replayed']} since the node started" in relay
        # the config at a glance, from the start record
        config = app.query_one("#config-table", DataTable)
        assert config.get_cell("train.learning_rate", "value").plain == \
            f"{RECORDS[0]['config']['train']['learning_rate']:g}"
        assert config.get_cell("model", "value").plain == RECORDS[0]["model"]


async def test_peers_table_matches_the_last_round():
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        table = app.query_one(PeersTable)
        assert [k.value for k in table.rows] == list(LAST["peers"])
        now = max(LAST["time"], RECORDS[-1]["time"])
        for node, peer in LAST["peers"].items():
            row = {key: table.get_cell(node, key).plain for key, _ in PeersTable.COLUMNS}
            assert row["node"] == node
            assert row["model"] == text(peer["model"], 28) and row["tokenizer"] == peer["tokenizer"]
            assert row["sent"] == str(peer["sent"])
            assert row["accepted"] == str(peer["accepted"])
            assert row["rejected"] == str(peer["rejected"])
            assert row["acceptance_rate"] == f"{100 * peer['acceptance_rate']:.1f}%"
            assert row["kl_mean"] == kl_words(peer["kl_mean"], kl_gate(app.state))    # a number with its meaning
            assert row["quarantined"] == ("yes" if peer["quarantined"] else "no")
            assert row["last_seen"] == age(now - peer["last_seen"])
        # the highlighted peer's rejection reasons
        detail = plain(app.query_one("#peer-detail", Packed))
        first = next(iter(LAST["peers"]))
        for reason, count in LAST["peers"][first]["rejected_by_reason"].items():
            assert f"{reason} {count}" in detail
        await pilot.press("down")
        await pilot.pause()
        second = list(LAST["peers"])[1]
        assert plain(app.query_one("#peer-detail", Packed)).startswith(second)


async def test_peers_table_and_plots_follow_new_lines(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one(PeersTable)
        assert table.row_count == len(LAST["peers"])
        new_round = dict(LAST, round=LAST["round"] + 1, time=LAST["time"] + 20)
        new_round["reward/own"] = 0.9
        new_round["peers"] = dict(LAST["peers"], **{"qwen-node": {
            "model": "Qwen2.5-0.5B-Instruct", "tokenizer": "qwen2", "last_seen": LAST["time"] + 15,
            "sent": 4, "accepted": 3, "rejected": 1, "rejected_by_reason": {"stale": 1},
            "acceptance_rate": 0.75, "kl_mean": 0.05, "quarantined": False}})
        line = orjson.dumps(new_round) + b"\n"
        append(run, line[:40])                      # a torn line: held back until it completes
        await pilot.pause(0.2)
        assert table.row_count == len(LAST["peers"])
        append(run, line[40:])
        await wait_for(pilot, lambda: table.row_count == len(LAST["peers"]) + 1)
        assert table.get_cell("qwen-node", "acceptance_rate").plain == "75.0%"
        assert table.get_cell("qwen-node", "last_seen").plain == "5s"
        assert cell(app, "round") == str(LAST["round"] + 1)
        assert plain(app.query_one("#panel-reward .stats", Packed)).startswith("own 0.900")
        assert all(xs[-1] == LAST["round"] + 1 for xs in plotted_rounds(app, "panel-reward"))
        # a hidden tab's plots catch up when it is shown
        assert all(xs[-1] < LAST["round"] + 1 for xs in plotted_rounds(app, "panel-filter"))
        await pilot.press("2")
        await wait_for(pilot, lambda: all(xs[-1] == LAST["round"] + 1
                                          for xs in plotted_rounds(app, "panel-filter")))
        assert len(plotted_rounds(app, "panel-filter")) == 3


async def test_log_pane_follows_node_log(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("7")
        log = app.query_one("#log", Log)
        last_line = (run / "node.log").read_text().splitlines()[-1]
        await wait_for(pilot, lambda: log.lines and log.lines[-1] == last_line)
        with open(run / "node.log", "a") as fh:
            fh.write("08:10:40 WARN  relay latency 900 ms\n08:10:41 INFO  part")
        await wait_for(pilot, lambda: log.lines[-1] == "08:10:40 WARN  relay latency 900 ms")
        assert "part" not in log.lines[-1]          # an unfinished line waits for its newline


async def test_missing_keys_nulls_and_garbage_render_as_dash(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    append(run, {"type": "start", "time": 1.0, "node_id": "odd-node", "model": None, "config": "oops"})
    append(run, b"this is not json\n")
    append(run, b"[1, 2, 3]\n")
    append(run, {"type": "mystery"})
    append(run, {"type": "round", "round": 1, "time": 2.0, "reward/own": None, "accuracy/own": "high",
                 "filter/dropped_frac": True, "gen/tok_s": None,
                 "relay/connected": None, "peers": {"p1": "not a dict", "p2": {"sent": "many",
                                                   "quarantined": "maybe", "last_seen": None}}})
    append(run, {"type": "round", "round": "two", "time": 3.0, "loss": [1], "peers": None})
    (run / "config.toml").write_text("this is = = not toml")
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.state.ignored == 2                # the list and the unknown type
        assert cell(app, "round") == "2"             # "two" read as the next round
        for key in ("accuracy", "dropped", "speed", "relay"):
            assert cell(app, key) == "–", key
        assert cell(app, "reward") == "–/–"
        table = app.query_one(PeersTable)
        assert [k.value for k in table.rows] == ["p2"]
        assert table.get_cell("p2", "sent").plain == "–"
        assert table.get_cell("p2", "quarantined").plain == "–"
        assert table.get_cell("p2", "last_seen").plain == "–"
        for tab in "1234567":                        # every panel draws without raising
            await pilot.press(tab)
            await pilot.pause()
        assert "loss –" in plain(app.query_one("#panel-loss .stats", Packed))
        assert "config from start record" not in plain(app.query_one("#config-source", Static))
        assert "unreadable" in plain(app.query_one("#config-source", Static))


async def test_waiting_for_metrics_then_first_round(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert cell(app, "state") == "waiting…"
        assert "waiting for metrics" in app.sub_title
        append(run, RECORDS[0])
        append(run, ROUNDS[0])
        await wait_for(pilot, lambda: cell(app, "round") == "1")
        assert cell(app, "state") == "running"


# ---- keys ----------------------------------------------------------------------------------
async def test_p_pauses_and_resumes(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert cell(app, "state") == "running"
        await pilot.press("p")                       # watching someone's node: p asks, y confirms
        assert read_control(run) == {"pause": False, "stop": False}
        await pilot.press("y")
        assert read_control(run) == {"pause": True, "stop": False}
        assert cell(app, "state") == "paused" and app.sub_title.startswith("paused")
        await pilot.pause(0.2)                       # the next poll keeps it (file agrees)
        assert cell(app, "state") == "paused"
        await pilot.press("p", "x", "y")             # any other key answers no
        assert read_control(run) == {"pause": True, "stop": False}
        await pilot.press("p", "y")
        assert read_control(run) == {"pause": False, "stop": False}
        assert cell(app, "state") == "running"


async def test_p_on_a_finished_run_writes_nothing(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert not (run / "control.json").exists()
        assert cell(app, "state") == "finished"


async def test_watching_q_leaves_and_never_stops_the_node(tmp_path):
    """`ftis-edge watch` on someone's live node: q (out of habit) and Ctrl-C leave, the node runs on;
    S alone, or a y long after it, stops nothing."""
    run = live_copy(tmp_path)
    for keys in (["q"], ["ctrl+c"], ["S", "x", "y"], ["q", "q"]):
        app = DashboardApp(run, poll_interval=FAST)
        async with app.run_test(size=(80, 24)) as pilot:
            for key in keys:
                await pilot.press(key)
            await wait_for(pilot, lambda: app.return_code is not None or keys[0] == "S", timeout=2)
        assert read_control(run)["stop"] is False, keys


async def test_watching_s_then_y_asks_the_node_to_stop_and_leaves_when_it_has(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("S")
        assert read_control(run)["stop"] is False
        await pilot.press("y")
        assert read_control(run) == {"pause": False, "stop": True}
        assert cell(app, "state") == "stopping…"
        assert "stopping after this round" in app.sub_title
        await pilot.pause(0.2)
        assert app.return_code is None               # still waiting for the node
        append(run, {"type": "stop", "time": LAST["time"] + 1, "round": LAST["round"], "reason": "user"})
        await wait_for(pilot, lambda: app.return_code is not None)
        assert app.return_code == 0


async def test_q_twice_leaves_at_once(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("S", "y")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None)
        assert read_control(run)["stop"] is True


async def test_q_on_a_finished_run_leaves_immediately(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, timeout=1)
        assert not (run / "control.json").exists()


NODE = r"""
import json, os, sys, time
run = sys.argv[1]
for _ in range(600):                       # a stand-in node: obeys control.json between "rounds"
    try:
        control = json.load(open(os.path.join(run, "control.json")))
    except (FileNotFoundError, ValueError):
        control = {}
    if control.get("stop"):
        with open(os.path.join(run, "metrics.jsonl"), "a") as fh:
            fh.write(json.dumps({"type": "stop", "time": time.time(), "round": 30, "reason": "user"}) + "\n")
        sys.exit(0)
    if len(sys.argv) > 2:
        sys.exit(int(sys.argv[2]))
    time.sleep(0.05)
"""


async def test_q_with_a_node_process_exits_when_it_ends(tmp_path):
    run = live_copy(tmp_path)
    node = subprocess.Popen([sys.executable, "-c", NODE, str(run)])
    try:
        app = DashboardApp(run, node_process=node, poll_interval=FAST)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.check_action("detach", ()) is False   # never orphan our own child
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, timeout=10)
            assert app.return_code == 0 and node.poll() == 0
            assert app.state.finished
    finally:
        node.kill()
        node.wait()


async def test_a_crashed_node_is_shown_not_hidden(tmp_path):
    run = live_copy(tmp_path)
    node = subprocess.Popen([sys.executable, "-c", NODE, str(run), "3"])
    try:
        app = DashboardApp(run, node_process=node, poll_interval=FAST)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.node_exit is not None, timeout=10)
            await pilot.pause()
            assert cell(app, "state") == "exited 3"
            assert app.return_code is None            # stays open so the log can be read
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None)
            assert app.return_code == 3
            assert not (run / "control.json").exists()
    finally:
        node.kill()
        node.wait()


async def test_help_and_tab_keys(tmp_path):
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        tabs = app.query_one(TabbedContent)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = plain(app.screen.query_one("#help-text", Static))
        assert "pause / resume" in help_text and "stop the node" in help_text
        await pilot.press("q")                       # q closes the help; it does not stop the node
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen) and app.return_code is None
        await pilot.press("5")
        assert tabs.active == "tab-peers"
        await pilot.press("right_square_bracket")
        assert tabs.active == "tab-config"
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert tabs.active == "tab-speed"
        await pilot.press("1")
        assert tabs.active == "tab-overview"


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_every_tab_renders_at_both_sizes(size):
    app = DashboardApp(FIXTURE, poll_interval=FAST)
    async with app.run_test(size=size) as pilot:
        for tab in "1234567":
            await pilot.press(tab)
            await pilot.pause()
            text = screen_text(app)
            assert len(text.splitlines()) == size[1]
            assert "finished" in text                # the headline is always there
        await pilot.press("1")
        await pilot.pause()
        text = screen_text(app)
        assert "reward" in text and "accuracy" in text
        big = size == (160, 50)
        # the large overview also shows filter rates, IS weights, loss and KL
        for panel in ("ov-filter", "ov-is", "ov-loss", "ov-kl"):
            assert (app.query_one(f"#{panel}").region.height > 0) == big, panel
        for panel in ("panel-reward", "panel-accuracy"):
            assert app.query_one(f"#{panel}").region.height >= (20 if big else 15)


# ---- watch ---------------------------------------------------------------------------------
def watch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ftis-edge watch")
    watch.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_watch_refuses_what_it_cannot_watch(tmp_path, capsys):
    assert watch.run(watch_args(str(tmp_path / "nope"))) == 2
    assert capsys.readouterr().err.strip() == f"ftis-edge watch: no run directory at {tmp_path / 'nope'}"
    (tmp_path / "empty").mkdir()
    assert watch.run(watch_args(str(tmp_path / "empty"))) == 2
    assert "is not a run directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert watch.run(watch_args(str(tmp_path / "file"))) == 2
    assert "is a file" in capsys.readouterr().err
    assert watch.run(watch_args(str(FIXTURE), "--interval", "0")) == 2
    assert "--interval" in capsys.readouterr().err
    assert watch.run(watch_args(str(FIXTURE))) == 2   # pytest's stdout is not a terminal
    err = capsys.readouterr().err
    assert "needs a terminal" in err and len(err.strip().splitlines()) == 1


def test_watch_in_a_real_terminal(tmp_path):
    """End to end: `watch` on a finished run in a pseudo-terminal, then q."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    code = ("import argparse, sys; from ftis_edge.tui import watch; p = argparse.ArgumentParser(); "
            "watch.add_arguments(p); sys.exit(watch.run(p.parse_args(sys.argv[1:])))")
    leader, follower = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="30")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdin=follower, stdout=follower,
                            stderr=follower, env=env, cwd=ROOT, close_fds=True)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"finished" not in seen and time.monotonic() < deadline:   # the dashboard drew
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
        assert b"finished" in seen, seen[-2000:]
        os.write(leader, b"q")
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    os.read(leader, 65536)
                except OSError:
                    pass
        assert proc.wait(timeout=1) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(leader)
    assert not (run / "control.json").exists()


# ---- the pieces under the app --------------------------------------------------------------
def test_run_state_resume_and_means():
    state = RunState()
    state.ingest([{"type": "start"}] + [{"type": "round", "round": i, "reward/own": i / 10}
                                        for i in range(1, 13)])
    assert state.mean_last("reward/own") == pytest.approx(sum(range(3, 13)) / 100)
    state.ingest([{"type": "stop", "round": 12}])
    assert state.finished
    # resumed from a checkpoint at round 8: rounds 8.. are replaced, the run is live again
    state.ingest([{"type": "start"}, {"type": "round", "round": 8, "reward/own": 0.0}])
    assert not state.finished
    assert state.series("reward/own")[0] == list(range(1, 9))
    assert state.last("reward/own") == 0.0


def test_relay_cell_says_off_down_ok_or_dash():
    state = RunState()
    assert relay_health(state).short == "–"
    state.ingest([{"type": "start", "relay": "tcp://r:5555"},
                  {"type": "round", "round": 1, "relay/connected": False}])
    assert relay_health(state).short == "down"
    state.ingest([{"type": "round", "round": 2, "relay/connected": True, "relay/latency_ms": 12.4}])
    assert relay_health(state).short == "ok 12ms"
    # the client's health wins over the flag: one reading for header, headline and Peers tab
    state.ingest([{"type": "round", "round": 3, "relay/connected": True, "relay/state": "refused",
                   "relay/reason": "key not allowed"}])
    assert relay_health(state).short == "down"
    assert relay_health(state).problem == "refused (key not allowed)"
    state.ingest([{"type": "start", "relay": None}])
    assert relay_health(state).short == "off" and relay_health(state).problem is None


def test_log_tail_skips_a_partial_first_line_and_survives_truncation(tmp_path):
    path = tmp_path / "node.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    tail = LogTail(path, initial_bytes=30)
    first = tail.poll()
    assert first and first[-1] == "line 99" and all(ln.startswith("line ") for ln in first)
    assert len(first) < 5
    path.write_text("new\n")                          # truncated / replaced
    assert tail.poll() == ["new"]


def test_packed_lines_wrap_between_chunks_only():
    packed = Packed()
    packed.chunks = [field("peer wait", "1.0 s"), field("sync", "0.4 s"), BREAK, field("tokens", "2650")]
    assert [c.plain for c in packed.pack(80)] == ["peer wait 1.0 s   sync 0.4 s", "tokens 2650"]
    assert [c.plain for c in packed.pack(20)] == ["peer wait 1.0 s", "sync 0.4 s", "tokens 2650"]
    assert [c.plain for c in packed.pack(5)] == ["peer wait 1.0 s", "sync 0.4 s", "tokens 2650"]


def test_round_ticks_are_whole_rounds():
    assert round_ticks(1, 30) == [5, 10, 15, 20, 25, 30]
    assert round_ticks(1, 1) == [1]
    assert round_ticks(3, 7) == [3, 4, 5, 6, 7]
    assert all(len(round_ticks(1, n)) <= 6 for n in range(1, 5000, 37))
