"""Files and names from someone else that are not what they claim: a FIFO where a checkpoint
manifest or an adapter should be (reading one blocks for ever), a config nested 100,000 deep,
a checkpoint whose learner entry is a tensor, and a bridged namespace that only looks like a
relay's name. Each fails in one line, nothing hangs."""
from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
import torch

from ftis_edge.store import checkpoint
from ftis_edge import config
from relay import protocol as P
from messages import dealer, hello, raw_rollout
from procs import ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")


def _cli(*args, timeout=120):
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("ftis-edge")]
    return r, lines


def _run_dir(tmp_path, state: dict | None = None):
    run = tmp_path / "shared-run"
    run.mkdir()
    cfg = config.from_dict({"node": {"id": "victim", "run_dir": str(run)}})
    (run / "config.toml").write_text(config.to_toml(cfg))
    (run / "metrics.jsonl").write_text('{"type": "start"}\n{"type": "round", "round": 1}\n')
    checkpoint.save(run, 1, state or {"round": 1, "learner": {}})
    return run


@pytest.mark.parametrize("command", ["export", "start --resume"])
def test_a_fifo_manifest_fails_in_one_line(tmp_path, command):
    run = _run_dir(tmp_path)
    manifest = checkpoint.dir_of(run) / "round-000001" / checkpoint.MANIFEST
    manifest.unlink()
    os.mkfifo(manifest)
    args = {"export": ("export", str(run), "--eval-limit", "0"),
            "start --resume": ("start", str(run / "config.toml"), "--headless", "--resume")}[command]
    r, lines = _cli(*args)                    # before: blocked on the FIFO until the timeout
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "not a regular file" in lines[0], lines


def test_a_fifo_adapter_does_not_hang_eval(tmp_path):
    run = _run_dir(tmp_path)
    (run / "adapter").mkdir()
    os.mkfifo(run / "adapter" / "latest.gguf")
    os.mkfifo(run / "adapter" / "adapter-v000001.gguf")
    r, lines = _cli("eval", "--model", str(run), "--task", "arith", "--limit", "1")
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr


def test_a_fifo_or_deeply_nested_config_is_one_config_error(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(config.ConfigError, match="nested too deeply"):
        config.load(deep)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(config.ConfigError, match="not a regular file"):
        config.load(fifo)
    r, lines = _cli("start", str(deep), "--headless")
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr


def test_a_state_whose_learner_is_a_tensor_is_refused_in_one_line(tmp_path):
    run = _run_dir(tmp_path, {"round": 1, "learner": torch.zeros(3)})
    with pytest.raises(checkpoint.CheckpointError, match="'learner' entry is a Tensor"):
        checkpoint.load_round(run, 1)
    r, lines = _cli("export", str(run), "--eval-limit", "0")
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_look_alike_namespaces_are_refused_by_an_unrestricted_bridge(relay):
    """`--trust-bridge br` (any namespace): `alice@relay-a` passes, `alice@rеlay-a` (Cyrillic
    е), `alice@А` and a namespace with a control character are `bad_origin`."""
    r = relay("--name", "relay-b", "--trust-bridge", "br", "--open-bridges")
    s = dealer(r.address)
    try:
        assert hello(s, "br")[0] == P.WELCOME
        answers = []
        for i, origin in enumerate(["alice@relay-a", "alice@r\u0435lay-a", "alice@\u0410", "alice@relay\x1b-a",
                                    "al\u202eice@relay-a"]):
            s.send_multipart([P.PUB, b"s", raw_rollout(f"r{i}"), orjson.dumps({"origin": origin})])
            assert s.poll(5000)
            answers.append(s.recv_multipart())
        assert answers[0][0] == P.ACK, answers
        assert [a[2] for a in answers[1:]] == [b"bad_origin"] * 4, answers
    finally:
        s.close(0)
