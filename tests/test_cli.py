"""The command line: init writes a valid file; user mistakes get one line and exit code 2."""
import subprocess
import sys

from ftis_edge import config
from procs import ROOT


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_init_writes_a_commented_file_that_loads(tmp_path):
    path = tmp_path / "node.toml"
    r = run("init", str(path))
    assert r.returncode == 0, r.stderr
    cfg = config.load(path)
    assert cfg.to_dict() == config.Config().to_dict()
    assert run("init", str(path)).returncode == 2            # refuses to overwrite


def test_bad_config_is_one_clear_line(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text("[train]\nmethod = \"ppo\"\n")
    r = run("start", str(path), "--headless")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ftis-edge: error: train.method: must be one of nois, vis, tis, f-tis, f-vis; got 'ppo'"]
    r = run("start", str(tmp_path / "missing.toml"), "--headless")
    assert r.returncode == 2 and "no such config file" in r.stderr and "Traceback" not in r.stderr


def test_an_existing_run_is_never_overwritten_silently(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run"\n')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    r = run("start", str(path), "--headless")
    assert r.returncode == 2 and "--resume" in r.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"


def test_unknown_model_is_one_clear_line(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run"\n[model]\nspec = "{tmp_path}/nope.gguf"\n')
    r = run("start", str(path), "--headless")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("ftis-edge: error:")


def test_help_lists_the_commands():
    r = run("--help")
    for cmd in ("start", "init", "eval", "watch"):
        assert cmd in r.stdout
