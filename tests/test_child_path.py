"""No child interpreter imports code from the current directory (issue 51 item 1)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftis_edge.common import child
from testkit.hostile import CONSOLE_SCRIPT, plant


@pytest.fixture
def hostile(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "marker"
    run.mkdir()
    plant(run, marker)
    return run, marker


@pytest.mark.parametrize("safe_flag", [True, False], ids=["-P", "3.10-prelude"])
def test_python_command_c_and_m(hostile, monkeypatch, safe_flag):
    """Both forms, with -P (3.11+) and with the 3.10 prelude (exercised here on this Python)."""
    run, marker = hostile
    monkeypatch.setattr(child, "SAFE_PATH_FLAG", safe_flag)
    env = child.python_env({**os.environ, "PYTHONPATH": os.pathsep + os.environ.get("PYTHONPATH", "")})
    r = subprocess.run(child.python_command("-c", "import csv, argparse, json; print('ok', __import__('sys').argv[1:])",
                                            "a", "b"), cwd=run, env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "ok ['a', 'b']", r.stderr
    r = subprocess.run(child.python_command("-m", "json.tool", "--help"), cwd=run, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "json.tool" in r.stdout, r.stderr
    assert not marker.exists(), marker.read_text()


def test_python_command_refuses_other_forms():
    with pytest.raises(ValueError):
        child.python_command("script.py")


def test_python_env_keeps_pythonpath_without_empty_entries(monkeypatch):
    monkeypatch.setattr(child, "PACKAGE_ROOT", "/pkg/root")
    monkeypatch.setattr(child, "_is_site_dir", lambda path: False)
    env = child.python_env({"PYTHONPATH": f"/a{os.pathsep}{os.pathsep}/b{os.pathsep}", "X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/pkg/root", "/a", "/b"] and env["X"] == "1"
    assert child.python_env({"PYTHONPATH": "/pkg/root"})["PYTHONPATH"] == "/pkg/root"
    monkeypatch.setattr(child, "_is_site_dir", lambda path: True)      # installed: nothing added
    assert "PYTHONPATH" not in child.python_env({"PYTHONPATH": os.pathsep})


def test_console_script_path_is_its_folder(tmp_path, hostile):
    """`ftis-edge` (a console script) has its own folder, not the current directory, first."""
    run, _ = hostile
    script = tmp_path / "bin" / "probe"
    script.parent.mkdir()
    script.write_text("import sys\nprint(sys.path[0])\n")
    r = subprocess.run([sys.executable, str(script)], cwd=run, capture_output=True, text=True)
    assert Path(r.stdout.strip()) == script.parent


@pytest.mark.slow
@pytest.mark.model
def test_eval_in_hostile_run_dir(hostile, smol):
    """`cd RUN && ftis-edge eval --model smollm2-135m --task arith`: grading ran, nothing planted did."""
    run, marker = hostile
    script = run.parent / "bin" / "ftis-edge"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    r = subprocess.run([sys.executable, str(script), "eval", "--model", "smollm2-135m", "--task", "arith",
                        "--limit", "2", "--max-new-tokens", "16", "--quiet"], cwd=run, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
