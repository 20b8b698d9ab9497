"""The resume command the stop summary prints keeps the swarm: a resumed run continues with its
relay and node id unless told otherwise, and a run resumed alone says so (a real relay, real nodes)."""
from __future__ import annotations

import pytest

from ftis_edge.store import checkpoint
from ftis_edge.metrics.records import read_metrics
from procs import cli, finish, start_node, write_config

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]


def starts(run) -> list[dict]:
    return [r for r in read_metrics(run) if r.get("type") == "start"]


def test_resume_as_printed_rejoins_the_relay_and_alone_is_said(tmp_path, relay):
    r = relay()
    cfg = write_config(tmp_path, "alice", node={"rounds": 3, "checkpoint_every": 1}, eval={"every": 0},
                       swarm={"max_wait_s": 0.2, "fill_by_worth": True, "prompt_choice": "outcomes"})
    run = tmp_path / "alice"
    finish(start_node(cfg, "--relay", r.address, "--rounds", "1"))
    saved = checkpoint.load_latest(run)               # the worth and outcome books travel with a checkpoint
    assert saved["worth"]["window"] == 8 and len(saved["worth"]["rounds"]) == 1 and "own_rate" in saved["outcomes"]
    assert starts(run)[-1]["relay"] == r.address
    # exactly the summary's resume command: config, --run-dir, --resume; no --relay
    out = cli("start", str(cfg), "--headless", "--run-dir", str(run), "--resume", "--rounds", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming {run} as it ran: relay {r.address} (swarm 'ftis')" in out.stderr
    resumed = starts(run)[-1]
    assert (resumed["relay"], resumed["node_id"], resumed["resumed_from"]) == (r.address, "alice", 1)
    assert resumed["collaboration"] != "alone"
    # told otherwise: --relay '' resumes alone, and the node says the run was in a swarm
    out = cli("start", str(cfg), "--headless", "--run-dir", str(run), "--resume", "--relay", "")
    assert out.returncode == 0, out.stderr[-3000:]
    alone = starts(run)[-1]
    assert (alone["relay"], alone["collaboration"], alone["resumed_from"]) == (None, "alone", 2)
    text = out.stdout + out.stderr
    assert f"this run trained in swarm 'ftis' via {r.address}; resumed ALONE now (add --relay {r.address}" in text
