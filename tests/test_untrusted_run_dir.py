"""A shared run directory must not run code: the attack of issue 29, against real commands.

The attacker writes ``checkpoints/round-000001/state.pt`` as a pickle whose ``__reduce__``
runs a shell command (here: it creates a marker file), and a manifest that matches it (the
checksum only detects damage). ``export``, ``start --resume`` and ``eval --model RUN_DIR``
each must stop with one line, and the command must never run: a checkpoint's state is only
ever read from ``state.safetensors``.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys

import pytest

from ftis_edge.store import checkpoint
from ftis_edge import config
from procs import ROOT, RUN_DIR_COMMANDS, cli, run_dir_command


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_run_dir(tmp_path, protocol: int = 2):
    """Protocol 2 (what torch.save writes) reaches the GLOBAL opcode that names os.system."""
    run = tmp_path / "shared-run"
    marker = tmp_path / "PWNED"
    ckpt = run / "checkpoints" / "round-000001"
    ckpt.mkdir(parents=True)
    cfg = config.from_dict({"node": {"id": "victim", "run_dir": str(run)}})
    (run / "config.toml").write_text(config.to_toml(cfg))
    (run / "metrics.jsonl").write_text('{"type": "start"}\n{"type": "round", "round": 1}\n')
    data = pickle.dumps({"round": 1, "learner": _Payload(marker)}, protocol=protocol)
    (ckpt / "state.pt").write_bytes(data)
    (ckpt / "manifest.json").write_text(json.dumps(
        {"round": 1, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    return run, marker


def test_the_payload_really_runs_when_unpickled(tmp_path):
    """The attack is real: plain pickle.loads of the crafted file creates the marker."""
    run, marker = crafted_run_dir(tmp_path)
    pickle.loads((run / "checkpoints" / "round-000001" / "state.pt").read_bytes())
    assert marker.exists()


@pytest.mark.parametrize("command", RUN_DIR_COMMANDS)
def test_a_crafted_checkpoint_runs_nothing_and_fails_in_one_line(tmp_path, command):
    run, marker = crafted_run_dir(tmp_path)
    args = run_dir_command(command, run)
    r = cli(*args)
    print(f"$ ftis-edge {' '.join(args)}  -> exit {r.returncode}\n{r.stderr.strip()}")
    assert not marker.exists(), "the pickle ran its command"
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("ftis-edge")]
    assert len(lines) == 1 and r.stderr.strip().endswith(lines[0]) and "Traceback" not in r.stderr, r.stderr
    want = {"export": "no checkpoint yet", "start --resume": "no checkpoint in",
            "eval --model": "no adapter/latest.gguf yet"}[command]
    assert want in lines[0], lines[0]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_pickle_of_any_protocol_is_no_checkpoint(tmp_path, protocol):
    run, marker = crafted_run_dir(tmp_path, protocol)
    assert checkpoint.complete(run) == [] and checkpoint.load_latest(run) is None
    assert not marker.exists()


def test_checkpoint_files_hold_no_pickle(tmp_path):
    """What a checkpoint writes now is safetensors + JSON: no pickle opcode stream anywhere."""
    import torch
    checkpoint.save(tmp_path, 1, {"round": 1, "learner": {"w": torch.ones(3)}, "rng": {"python": (3, (1, 2), None)}})
    files = sorted(p.name for p in (tmp_path / "checkpoints" / "round-000001").iterdir())
    assert files == ["manifest.json", "state.safetensors"]
    head = (tmp_path / "checkpoints" / "round-000001" / "state.safetensors").read_bytes()[:2]
    assert head != b"\x80\x02" and not head.startswith(b"PK")       # neither a pickle nor torch's zip
    state = checkpoint.load_latest(tmp_path)
    assert state["rng"]["python"] == (3, (1, 2), None) and torch.equal(state["learner"]["w"], torch.ones(3))


@pytest.mark.parametrize("answer", ['__import__("os").system("touch {m}")',
                                    '$__import__("os").system("touch {m}")$',
                                    '1+__import__("os").system("touch {m}")',
                                    '\\boxed{{__import__("os").system("touch {m}")}}'])
def test_a_peer_answer_that_is_python_is_graded_not_run(tmp_path, answer):
    """Peers' completions are re-graded with math-verify, whose plain-expression path calls
    sympy's parse_expr (an eval): its regex admits only digits and operators, so code never
    reaches it. This keeps that true for the versions installed."""
    from ftis_edge.tasks.rewards import answers_match
    marker = tmp_path / "PWNED"
    assert answers_match(answer.format(m=marker), "2") is False
    assert not marker.exists()


@pytest.mark.parametrize("command", ["export", "eval --model"])
def test_a_run_dir_whose_task_is_python_code_imports_nothing(tmp_path, command):
    """A shared run dir's config.toml may name a task class (``module:Class``); building it
    imports the module, i.e. runs its code. Loading someone's run dir refuses that in one line
    unless FTIS_EDGE_TRUST_TASK_CODE=1 says the user trusts it."""
    from ftis_edge.store import rundir
    run, marker = crafted_run_dir(tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    (code / "evil_task.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                                       "from ftis_edge.tasks import Task\nclass Evil(Task):\n    pass\n")
    text = (run / "config.toml").read_text().replace('name = "arith"', 'name = "evil_task:Evil"', 1)
    assert "evil_task:Evil" in text
    (run / "config.toml").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != rundir.TRUST_TASK_CODE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")])
    r = cli(*run_dir_command(command, run), env=env)
    print(r.stderr)
    assert not marker.exists(), "the run dir's task module was imported"
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is Python code" in r.stderr and rundir.TRUST_TASK_CODE_ENV in r.stderr
    # the threat is real: building that task imports the module, which runs its code
    subprocess.run([sys.executable, "-c", "from ftis_edge.tasks import get_task\n"
                    "try:\n    get_task('evil_task:Evil')\nexcept Exception:\n    pass"],
                   cwd=ROOT, env=env, timeout=120, check=True)
    assert marker.exists()
    marker.unlink()
