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


def test_python_env_keeps_pythonpath_without_any_spelling_of_the_current_directory(tmp_path):
    """Issue 62.7: only empty entries were dropped; ``.``, relative ones and the working
    directory's own path (however spelled) named it too."""
    run = tmp_path / "run"
    run.mkdir()
    spellings = ["", ".", "./", "x", "./lib", "..", str(run), f"{run}/", f"{tmp_path}/../{tmp_path.name}/run"]
    env = child.python_env({"PYTHONPATH": os.pathsep.join(["/a", *spellings, "/b"]), "X": "1"}, cwd=str(run))
    assert env["PYTHONPATH"].split(os.pathsep) == ["/a", "/b"] and env["X"] == "1"
    assert "PYTHONPATH" not in child.python_env({"PYTHONPATH": os.pathsep + "."}, cwd=str(run))


@pytest.mark.parametrize("safe_flag", [True, False], ids=["-P", "3.10-prelude"])
def test_the_package_root_comes_after_the_standard_library(tmp_path, monkeypatch, safe_flag):
    """Issue 62.7: the checkout root went first on PYTHONPATH, before the standard library, so a
    ``sitecustomize.py`` or ``csv.py`` beside the checkout ran in every child. Now the root is
    put on the path by the child's prelude, after the standard library: the package still
    imports, and neither planted file runs."""
    root, marker, run = tmp_path / "root", tmp_path / "marker", tmp_path / "run"
    root.mkdir()
    run.mkdir()
    plant(root, marker)
    (root / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('sitecustomize')\n")
    (root / "probe_mod.py").write_text("VALUE = 7\nif __name__ == '__main__':\n    print('main', VALUE)\n")
    monkeypatch.setattr(child, "PACKAGE_ROOT", str(root))
    monkeypatch.setattr(child, "_is_site_dir", lambda path: False)
    monkeypatch.setattr(child, "SAFE_PATH_FLAG", safe_flag)
    env = child.python_env(cwd=str(run))
    r = subprocess.run(child.python_command("-c", "import csv, json, probe_mod; print(probe_mod.VALUE)"), cwd=run,
                       env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "7", r.stderr
    r = subprocess.run(child.python_command("-m", "probe_mod"), cwd=run, env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "main 7", r.stderr
    assert not marker.exists(), marker.read_text()


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


def test_python_m_relay_from_a_shared_folder_runs_nothing_planted_there(hostile):
    """Issue 62.7: docs/relay.md's `python -m relay`, started in a shared folder, imported a
    planted argparse.py (the current directory comes first on sys.path). relay/__main__.py now
    drops it before importing anything, and the doc says `python -P -m relay`."""
    run, marker = hostile
    for flags in ([], ["-P"]):
        r = subprocess.run([sys.executable, *flags, "-m", "relay", "--help"], cwd=run, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "ftis-relay" in r.stdout, r.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
