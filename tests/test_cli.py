"""The command line: init writes a valid file; user mistakes get one line and exit code 2."""
import argparse
import os
import re
import socket
import subprocess
import sys

import pytest

from ftis_edge import config
from procs import ROOT


def run(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def test_init_writes_a_commented_file_that_loads(tmp_path):
    path = tmp_path / "node.toml"
    r = run("init", str(path))
    assert r.returncode == 0, r.stderr
    cfg = config.load(path)
    expected = config.Config().to_dict()
    expected["node"]["id"] = f"{socket.gethostname().split('.')[0]}-node"     # from the file's name
    expected["node"]["run_dir"] = f"{tmp_path}/runs/{{id}}"                    # beside the file, wherever started
    assert cfg.to_dict() == expected
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


def test_two_files_from_init_are_two_nodes_with_two_run_dirs(tmp_path):
    """The README's swarm recipe: init alice.toml, init bob.toml, start both on one PC."""
    for name in ("alice", "bob"):
        assert run("init", f"{name}.toml", cwd=tmp_path).returncode == 0
    host = socket.gethostname().split(".")[0]
    alice, bob = config.load(tmp_path / "alice.toml"), config.load(tmp_path / "bob.toml")
    assert (alice.node_id, bob.node_id) == (f"{host}-alice", f"{host}-bob")
    assert alice.run_path != bob.run_path
    assert config.load(tmp_path / "bob.toml", {"node.id": "carol"}).node_id == "carol"   # --node-id wins
    # alice has a run; bob's start must not collide with it (it gets as far as its missing model)
    (tmp_path / alice.run_path).mkdir(parents=True)
    (tmp_path / alice.run_path / "metrics.jsonl").write_text("{}\n")
    text = (tmp_path / "bob.toml").read_text()
    (tmp_path / "bob.toml").write_text(re.sub(r'(?m)^spec = ".*"$', f'spec = "{tmp_path}/nope.gguf"', text, count=1))
    r = run("start", "bob.toml", "--headless", cwd=tmp_path)
    assert r.returncode == 2 and "already holds a run" not in r.stderr and "nope.gguf" in r.stderr, r.stderr
    r = run("start", "alice.toml", "--headless", cwd=tmp_path)
    assert r.returncode == 2 and "already holds a run" in r.stderr
    assert "--overwrite DELETES that run" in r.stderr and r.stderr.index("--resume") < r.stderr.index("--overwrite")


@pytest.mark.parametrize("relay, says", [
    ("tcp://relay-host.invalid:5555", "swarm.relay: cannot resolve relay-host.invalid"),
    ("tcp://127.0.0.1:99999", "expected tcp://host:port (port 1-65535), got 'tcp://127.0.0.1:99999'"),
    ("tcp://127.0.0.1", "expected tcp://host:port"),
    ("tcp://:5555", "expected tcp://host:port"),
    ("tcp://127.0.0.1:55x5", "expected tcp://host:port"),
    ("127.0.0.1:5555", "expected tcp://host:port"),
])
def test_a_bad_relay_address_is_one_line_at_start(tmp_path, relay, says):
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run"\n')
    r = run("start", str(path), "--headless", "--relay", relay)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("ftis-edge: error: swarm.relay: ") and says in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()                   # refused before anything started


def test_relay_addresses_that_are_fine():
    assert config.split_relay("tcp://relay.example.org:5555") == ("relay.example.org", 5555)
    assert config.split_relay("tcp://[::1]:5555") == ("::1", 5555)
    assert config.split_relay("ipc:///tmp/relay.sock") is None
    config.resolve_relay("tcp://127.0.0.1:5555")              # resolves: no error


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


def test_every_command_and_option_has_help_and_the_defaults_are_said():
    """--help is complete: each command a description, each option a help text; what the README uses
    (eval --model RUN_DIR) and the defaults that matter (eval's offline task, export --quant) said."""
    from ftis_edge.cli import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in commands.items():
        assert sub.description, name
        for action in sub._actions:
            if action.dest != "help" and action.help != argparse.SUPPRESS:
                assert action.help, (name, action.dest)
    eval_help = " ".join(commands["eval"].format_help().split())
    assert "run directory" in eval_help and "default arith" in eval_help
    assert "(default auto: q8_0 below 1B parameters, q4_k_m above" in " ".join(commands["export"].format_help().split())
    assert commands["eval"].parse_args([]).task == "arith"


def test_a_ctrl_c_after_the_node_has_stopped_exits_130_without_a_traceback():
    # the node's stop record is written; the interpreter is still tearing down (threads, torch)
    # when a second Ctrl-C arrives: it leaves at once, quietly, instead of a KeyboardInterrupt
    # from whatever was being torn down (the CI run that saw exit -2)
    script = ("import os, signal, time\n"
              "from ftis_edge.cli import _ctrl_c_now_exits\n"
              "_ctrl_c_now_exits()\n"
              "print('stopped', flush=True)\n"
              "os.kill(os.getpid(), signal.SIGINT)\n"
              "time.sleep(30)\n"
              "print('still here')\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stdout == "stopped\n" and "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr
