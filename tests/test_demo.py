"""`ftis-edge demo --headless`: a relay and heterogeneous nodes on loopback, end to end (real
processes, the real models); the node choice and configs without running anything."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ftis_edge.store import checkpoint
from ftis_edge import config, demo
from ftis_edge.metrics.records import read_metrics, round_records
from dashboard import wait_for as settle
from procs import ROOT

# The swarm tests' held-out eval (round 0 and the end, in every node): small, because every node
# waits for the slowest one's (the HF generator's) and none of them checks accuracy; the product's
# demo keeps the node's 32 prompts (test_demo_nodes_are_valid_heterogeneous_configs).
EVAL_PROMPTS = 4


def test_demo_nodes_are_valid_heterogeneous_configs(tmp_path):
    paths = [demo.node_config(n, tmp_path, "tcp://127.0.0.1:5555", rounds=3, threads=1, max_wait_s=5.0)
             for n in demo.nodes()]
    cfgs = [config.load(p) for p in paths]
    assert [c.node_id for c in cfgs] == ["lora-llama", "full-hf", "gemma"]
    assert {(c.model.spec, c.model.backend, c.train.trainable) for c in cfgs} == {
        ("smollm2-135m", "auto", "lora"), ("smollm2-135m", "hf", "full"), ("gemma3-270m", "auto", "lora")}
    assert all(c.mode == "vertical" and c.node.rounds == 3 and c.run_path == tmp_path / c.node_id for c in cfgs)
    assert all(c.eval.prompts == config.EvalSection().prompts and c.eval.every > 0 for c in cfgs)   # the node's own
    small = config.load(demo.node_config(demo.nodes()[1], tmp_path, "tcp://127.0.0.1:5555", rounds=3, threads=1,
                                         max_wait_s=5.0, eval_prompts=EVAL_PROMPTS))
    assert small.eval.prompts == EVAL_PROMPTS and small.model.backend == "hf"


def test_demo_refuses_an_eval_of_no_prompts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "demo", "--headless", "--eval-prompts", "0",
                        "--dir", str(tmp_path / "demo")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--eval-prompts must be >= 1" in r.stderr, r.stderr
    assert not (tmp_path / "demo").exists()


def test_demo_leaves_out_what_the_machine_cannot_run_and_says_why(monkeypatch):
    monkeypatch.setattr(demo, "available_memory", lambda: 9 * demo.GB)
    chosen, notes = demo.choose(demo.nodes(), 3)
    assert [n.name for n in chosen] == ["lora-llama", "full-hf"]
    assert len(notes) == 1 and "gemma left out" in notes[0] and "9.0 GB of memory free" in notes[0]
    monkeypatch.setattr(demo, "available_memory", lambda: None)      # unknown: trust the user
    assert len(demo.choose(demo.nodes(), 3)[0]) == 3
    assert [n.name for n in demo.choose(demo.nodes(), 2)[0]] == ["lora-llama", "full-hf"]


@pytest.mark.model
@pytest.mark.timeout(2400)
@pytest.mark.slow
def test_demo_headless_runs_a_swarm_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "demo", "--headless", "--rounds", "1",
                        "--eval-prompts", str(EVAL_PROMPTS), "--dir", str(tmp_path / "demo")],
                       cwd=ROOT, capture_output=True, text=True, timeout=2300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names = [line.split(":")[0] for line in r.stdout.splitlines() if " rounds (" in line]
    assert len(names) >= 2 and names[:2] == ["lora-llama", "full-hf"], r.stdout
    for name in names:
        run = tmp_path / "demo" / name
        records = read_metrics(run)
        rounds = round_records(records)
        assert len(rounds) == 1 and records[-1]["type"] == "stop" and records[-1]["reason"] == "steps"
        assert rounds[0]["eval/n"] == EVAL_PROMPTS           # --eval-prompts reached every node
        assert checkpoint.complete(run) == [1]
        others = set(names) - {name}
        # every other node's groups reached this one and were accepted (peers/ in the record)
        assert others <= set(rounds[0]["peers"]), (name, rounds[0]["peers"])
        assert all(rounds[0]["peers"][o]["accepted"] >= 1 for o in others)
    assert "watch any of them again with: python -m ftis_edge.cli watch" in r.stdout   # as it was run


@pytest.mark.model
@pytest.mark.timeout(3000)
@pytest.mark.slow
async def test_demo_dashboard_shows_the_other_node_and_q_stops_them_all(tmp_path):
    """The demo's dashboard mode under Textual's pilot: the first node's dashboard lists the
    other node in its Peers tab; q stops every node after its round, each with a checkpoint."""
    from ftis_edge.tui import DashboardApp
    from ftis_edge.tui.widgets import PeersTable

    chosen, _ = demo.choose(demo.nodes(), 2)
    swarm = demo.Swarm(tmp_path / "demo", chosen, rounds=100, threads=1, max_wait_s=20.0,
                       eval_prompts=EVAL_PROMPTS)
    first = chosen[0]
    try:
        app = DashboardApp(tmp_path / "demo" / first.name, node_process=first.proc, node_stderr=first.stderr,
                           poll_interval=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: "full-hf" in app.state.peers or app.failure is not None, 2400)
            assert app.failure is None, app.failure
            await pilot.press("5")                     # the Peers tab
            await settle(pilot, lambda: "full-hf" in [k.value for k in app.query_one(PeersTable).rows])
            await pilot.press("q")
            await settle(pilot, lambda: app.return_code is not None, 600)     # the node stops after q
        assert app.return_code == 0
        swarm.stop()                                   # what `ftis-edge demo` does after the dashboard
    finally:
        swarm.close()
    assert not swarm.failed()
    for n in chosen:
        stop = read_metrics(tmp_path / "demo" / n.name)[-1]
        assert stop["type"] == "stop" and stop["reason"] == "user", (n.name, stop)
        assert checkpoint.complete(tmp_path / "demo" / n.name)[-1] == stop["round"] >= 1
