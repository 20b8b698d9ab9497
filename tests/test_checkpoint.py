"""Checkpoints and the run directory between runs: verified loads, fallback to an older
checkpoint, one-line failures, fresh starts that inherit nothing (real files, real torch.save)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from ftis_edge.store import checkpoint, rundir
from ftis_edge.store.checkpoint import CheckpointError
from ftis_edge.errors import FtisError


def _state(round_: int) -> dict:
    return {"round": round_, "learner": {"w": torch.full((64, 64), float(round_))}, "rng": {"python": None}}


def _save(run, *rounds):
    for r in rounds:
        checkpoint.save(run, r, _state(r))


def test_save_writes_a_manifest_and_keeps_the_newest_two(tmp_path):
    _save(tmp_path, 1, 2, 3)
    assert checkpoint.complete(tmp_path) == [2, 3]
    manifest = json.loads((tmp_path / "checkpoints" / "round-000003" / "manifest.json").read_text())
    assert manifest["round"] == 3
    assert manifest["bytes"] == (tmp_path / "checkpoints" / "round-000003" / checkpoint.STATE).stat().st_size
    state = checkpoint.load_latest(tmp_path)
    assert state["round"] == 3 and torch.equal(state["learner"]["w"], torch.full((64, 64), 3.0))


def test_no_checkpoint_at_all_is_none(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip", "no-manifest-truncated"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one_with_a_warning(tmp_path, caplog, damage):
    _save(tmp_path, 4, 5)
    newest = tmp_path / "checkpoints" / "round-000005"
    data = (newest / checkpoint.STATE).read_bytes()
    if damage == "truncate":
        (newest / checkpoint.STATE).write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        (newest / checkpoint.STATE).write_bytes(b"")
    elif damage == "flip":                   # same size, one byte changed: only the checksum sees it
        i = len(data) // 2
        (newest / checkpoint.STATE).write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    else:                                    # a checkpoint from before manifests: the load test sees it
        (newest / "manifest.json").unlink()
        (newest / checkpoint.STATE).write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="ftis_edge.store.checkpoint"):
        state = checkpoint.load_latest(tmp_path)
    assert state["round"] == 4
    text = caplog.text
    assert "round-000005 is unusable" in text and "older checkpoint of round 4" in text


def test_every_checkpoint_damaged_is_one_line_naming_each(tmp_path):
    _save(tmp_path, 1, 2)
    (tmp_path / "checkpoints" / "round-000002" / checkpoint.STATE).write_bytes(b"")
    p1 = tmp_path / "checkpoints" / "round-000001" / checkpoint.STATE
    p1.write_bytes(p1.read_bytes()[:100])
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_latest(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, FtisError)
    assert "round-000002: state.safetensors is empty" in msg and "round-000001" in msg and "truncated" in msg


def test_a_legacy_checkpoint_without_manifest_still_loads(tmp_path):
    _save(tmp_path, 3)
    (tmp_path / "checkpoints" / "round-000003" / "manifest.json").unlink()
    assert checkpoint.load_latest(tmp_path)["round"] == 3


def test_resume_without_a_checkpoint_is_an_error_unless_fresh_is_allowed(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(CheckpointError, match="stopped before its first checkpoint.*--resume-or-fresh"):
        rundir.check_resumable(tmp_path, fresh_if_missing=False)
    assert rundir.check_resumable(tmp_path, fresh_if_missing=True) is False
    _save(tmp_path, 1)
    assert rundir.check_resumable(tmp_path, fresh_if_missing=False) is True


def test_a_fresh_start_inherits_no_checkpoints_adapters_or_metrics_and_a_resume_no_adapters(tmp_path):
    _save(tmp_path, 7)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter-v000009.gguf").write_bytes(b"GGUF stale")
    for name in ("metrics.jsonl", "control.json", "node.log"):
        (tmp_path / name).write_text("old\n")
    rundir.prepare_resume(tmp_path)
    assert not (tmp_path / "adapter").exists() and checkpoint.complete(tmp_path) == [7]
    rundir.prepare_fresh(tmp_path)
    assert checkpoint.complete(tmp_path) == []
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "control.json").exists()
    assert (tmp_path / "node.log").read_text() == "old\n"       # diagnostics of the old run stay


def _gguf(path, kind: str):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_stop_summary_points_at_export_in_the_users_spelling(tmp_path):
    (tmp_path / "adapter").mkdir()
    _gguf(tmp_path / "adapter" / "adapter-v000003.gguf", "adapter")
    (tmp_path / "metrics.jsonl").write_text(
        '{"type":"start"}\n{"type":"round","round":3}\n{"type":"stop","round":3,"reason":"user"}\n')
    _save(tmp_path, 3)
    line = rundir.stop_summary(tmp_path, config="node.toml", program=".venv/bin/ftis-edge")
    assert line.splitlines()[:2] == ["stopped after round 3: stopped from the dashboard (q, Ctrl-C, or S then y)", f"  run dir   {tmp_path}"]
    # the run's own settings (RUN/config.toml) resume it, not the node file
    assert f"  resume    .venv/bin/ftis-edge start --run-dir {tmp_path} --resume" in line
    assert f"  export    .venv/bin/ftis-edge export {tmp_path}   (GGUF, Ollama, PEFT)" in line
    assert "adapter-v000003.gguf is a LoRA adapter, not a model" in line and len(line.splitlines()) == 5
    assert "a complete" not in line and "cp " not in line
    (tmp_path / "metrics.jsonl").write_text(
        '{"type":"round","round":2}\n{"type":"stop","round":2,"reason":"error","error":"model x: boom"}\n')
    # no traceback in node.log: none is promised; the checkpoint it left is resumable
    assert rundir.stop_summary(tmp_path, program="ftis-edge").splitlines() == [
        "failed after round 2: model x: boom", f"  resume    ftis-edge start --run-dir {tmp_path} --resume"]
    (tmp_path / "node.log").write_text("Traceback (most recent call last):\n  boom\n")
    assert rundir.stop_summary(tmp_path).startswith("failed after round 2: model x: boom — traceback in")
    # resumed and running: the previous run's stop is not this run's
    (tmp_path / "metrics.jsonl").write_text(
        '{"type":"start"}\n{"type":"round","round":3}\n{"type":"stop","round":3,"reason":"user"}\n'
        '{"type":"start"}\n{"type":"round","round":4}\n')
    line = rundir.stop_summary(tmp_path, program="ftis-edge")
    assert line.startswith("node still running after round 4") and "stopped" not in line


def test_latest_weights_reads_what_the_file_is_not_its_name(tmp_path):
    """latest.gguf is a hard link named neither adapter-* nor merged-*: its general.type decides."""
    import os
    folder = tmp_path / "adapter"
    folder.mkdir()
    assert rundir.latest_weights(tmp_path) is None
    _gguf(folder / "adapter-v000001.gguf", "adapter")
    os.link(folder / "adapter-v000001.gguf", folder / "latest.gguf")
    assert rundir.latest_weights(tmp_path) == (folder / "latest.gguf", "adapter")
    (folder / "latest.gguf").unlink()
    _gguf(folder / "merged-v000002.gguf", "model")
    os.link(folder / "merged-v000002.gguf", folder / "latest.gguf")
    assert rundir.latest_weights(tmp_path) == (folder / "latest.gguf", "model")
    (folder / "latest.gguf").write_bytes(b"GGUF not yet")       # half-written: no answer, no crash
    assert rundir.latest_weights(tmp_path) is None


@pytest.mark.parametrize("argv0, shown", [(".venv/bin/ftis-edge", ".venv/bin/ftis-edge"),
                                          ("/opt/x/ftis_edge/cli.py", "python -m ftis_edge.cli")])
def test_commands_are_shown_as_the_user_ran_them(argv0, shown):
    assert rundir.command_name(argv0) == shown


def test_last_error_line_reads_only_this_runs_part(tmp_path):
    path = tmp_path / "node.stderr"
    path.write_text("ftis-edge: error: an older run's failure\n")
    offset = path.stat().st_size
    assert rundir.last_error_line(path, offset) is None
    with open(path, "a") as fh:
        fh.write("some warning\nftis-edge: error: model 'x': not found\n")
    assert rundir.last_error_line(path, offset) == "model 'x': not found"


def test_a_real_node_state_round_trips_exactly_without_pickle(tmp_path):
    """Adam state (int keys, 0-d step tensors), betas tuples, every RNG state: back bit for bit."""
    import random

    import numpy as np
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    np.random.normal()                        # a cached gaussian in numpy's state
    state = {"round": 1, "learner": {"optimizer": opt.state_dict(), "mode": "lora", "version": 3},
             "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
             "peers": {"p": {"sent": 2, "quarantine_reason": None}}}
    checkpoint.save(tmp_path, 1, state)
    back = checkpoint.load_latest(tmp_path)
    assert back["rng"]["python"] == state["rng"]["python"]
    n0, n1 = state["rng"]["numpy"], back["rng"]["numpy"]
    assert n0[0] == n1[0] and np.array_equal(n0[1], n1[1]) and n1[1].dtype == n0[1].dtype and n0[2:] == n1[2:]
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    assert back["learner"]["optimizer"]["param_groups"] == state["learner"]["optimizer"]["param_groups"]
    for k, v in state["learner"]["optimizer"]["state"].items():
        for name, t in v.items():
            assert torch.equal(back["learner"]["optimizer"]["state"][k][name], t)
    assert back["peers"] == state["peers"]
    opt.load_state_dict(back["learner"]["optimizer"])    # what a resume does with it


def test_a_pickle_in_a_checkpoint_directory_is_never_opened(tmp_path):
    """Only state.safetensors is a checkpoint's state: a torch pickle beside it or instead of it
    (what a shared run dir may carry) is not read, so it cannot run code when loaded."""
    ckpt = tmp_path / "checkpoints" / "round-000004"
    ckpt.mkdir(parents=True)
    torch.save(_state(4), ckpt / "state.pt")
    assert checkpoint.complete(tmp_path) == [] and checkpoint.load_latest(tmp_path) is None
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        rundir.check_resumable(tmp_path, fresh_if_missing=False)      # before any model loads
    checkpoint.save(tmp_path, 3, _state(3))
    assert checkpoint.load_latest(tmp_path)["round"] == 3              # the pickle's round 4 is not one
