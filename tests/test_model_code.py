"""A model folder runs no code unless the user names it in FTIS_TRUST_MODEL_CODE.

The attacker ships a model folder inside a run directory (``model.spec`` points at it). Its
config says ``model_type: qwen2`` (so it passes the node's checks) but declares another
architecture, whose llama.cpp converter class loads the tokenizer with trust_remote_code=True,
and maps that tokenizer to a Python file in the folder. Each file here creates a marker when
its code runs: the marker must never appear, and each command fails in one line that names
the opt-in.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ftis_edge.store import checkpoint
from ftis_edge import config
from ftis_edge.models.gguf_io import GGUFError, convert_hf_to_gguf, converter_dir
from ftis_edge.models.model_code import TRUST_MODEL_CODE_ENV, code_in_model_dir
from ftis_edge.models.resolve import ModelError, resolve_model
from procs import ROOT, RUN_DIR_COMMANDS, cli, run_dir_command


def model_folder(path, marker, *, arch="QWenLMHeadModel", tokenizer_code=True, config_code=False, stray_py=False):
    """A tiny qwen2 folder; each flag adds one way to run ``marker``-writing code."""
    import torch
    from safetensors.torch import save_file
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen2", "architectures": [arch], "vocab_size": 64, "hidden_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
           "intermediate_size": 32, "max_position_embeddings": 64}
    code = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
            "from transformers import PreTrainedTokenizer, PretrainedConfig\n"
            "class Payload(PreTrainedTokenizer):\n    pass\nclass PayloadConfig(PretrainedConfig):\n    pass\n")
    if config_code:
        cfg["auto_map"] = {"AutoConfig": "payload.PayloadConfig"}
    (path / "config.json").write_text(json.dumps(cfg))
    if tokenizer_code:
        (path / "tokenizer_config.json").write_text(json.dumps(
            {"auto_map": {"AutoTokenizer": ["payload.Payload", None]}, "tokenizer_class": "Payload"}))
    if tokenizer_code or config_code or stray_py:
        (path / "payload.py").write_text(code)
    save_file({"model.embed_tokens.weight": torch.zeros(64, 16)}, str(path / "model.safetensors"))
    return path


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != TRUST_MODEL_CODE_ENV}
    env.update(extra)
    return env


def test_the_attack_is_real_without_the_guard(tmp_path):
    """llama.cpp's converter, run plainly on the folder, runs the folder's tokenizer code."""
    marker = tmp_path / "PWNED"
    folder = model_folder(tmp_path / "evil", marker)
    subprocess.run([sys.executable, str(converter_dir() / "convert_hf_to_gguf.py"), str(folder),
                    "--outfile", str(tmp_path / "o.gguf")], capture_output=True, timeout=300)
    assert marker.exists()


@pytest.mark.parametrize("kind", ["tokenizer auto_map", "config auto_map", "architecture only", "stray .py"])
def test_resolve_model_refuses_every_way_to_code_and_names_the_opt_in(tmp_path, kind, monkeypatch):
    monkeypatch.delenv(TRUST_MODEL_CODE_ENV, raising=False)
    marker = tmp_path / "PWNED"
    folder = model_folder(tmp_path / "m", marker, **{
        "tokenizer auto_map": dict(arch="Qwen2ForCausalLM"),
        "config auto_map": dict(arch="Qwen2ForCausalLM", tokenizer_code=False, config_code=True),
        "architecture only": dict(arch="ChatGLMModel", tokenizer_code=False),
        "stray .py": dict(arch="Qwen2ForCausalLM", tokenizer_code=False, stray_py=True)}[kind])
    with pytest.raises(ModelError) as e:
        resolve_model(str(folder))
    msg = str(e.value)
    assert "\n" not in msg and TRUST_MODEL_CODE_ENV in msg and str(folder.resolve()) in msg, msg
    assert not marker.exists()


def test_an_honest_folder_passes_and_the_opt_in_is_per_model(tmp_path, monkeypatch):
    honest = model_folder(tmp_path / "honest", tmp_path / "x", arch="Qwen2ForCausalLM", tokenizer_code=False)
    assert code_in_model_dir(honest) == []
    evil = model_folder(tmp_path / "evil", tmp_path / "PWNED")
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, str(honest))      # trusting another model trusts not this one
    with pytest.raises(ModelError):
        resolve_model(str(evil))
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, str(evil))
    assert resolve_model(str(evil)).spec == str(evil)


def test_the_converter_itself_runs_no_folder_code(tmp_path):
    """Second layer: should a folder get past the check, the converter still loads no code from it."""
    marker = tmp_path / "PWNED"
    folder = model_folder(tmp_path / "evil", marker)
    with pytest.raises(GGUFError):
        convert_hf_to_gguf(folder, tmp_path / "o.gguf")
    assert not marker.exists()


def _run_dir_with_model(tmp_path):
    run = tmp_path / "shared-run"
    marker = tmp_path / "PWNED"
    folder = model_folder(run / "model", marker)
    cfg = config.from_dict({"node": {"id": "victim", "run_dir": str(run)}, "model": {"spec": str(folder)}})
    run.mkdir(exist_ok=True)
    (run / "config.toml").write_text(config.to_toml(cfg))
    (run / "metrics.jsonl").write_text('{"type": "start"}\n{"type": "round", "round": 1}\n')
    checkpoint.save(run, 1, {"round": 1, "learner": {}})
    return run, marker


@pytest.mark.parametrize("command", RUN_DIR_COMMANDS)
def test_commands_on_a_shared_run_run_no_model_code(tmp_path, command):
    run, marker = _run_dir_with_model(tmp_path)
    r = cli(*run_dir_command(command, run), env=_env())
    print(r.stderr)
    assert not marker.exists(), "the model folder's code ran"
    assert r.returncode != 0 and TRUST_MODEL_CODE_ENV in r.stderr and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if TRUST_MODEL_CODE_ENV in ln]
    assert len(lines) == 1, r.stderr


def test_a_run_choosing_a_model_outside_itself_says_so(tmp_path):
    from ftis_edge.store import rundir
    outside = model_folder(tmp_path / "elsewhere", tmp_path / "x", arch="Qwen2ForCausalLM", tokenizer_code=False)
    run = tmp_path / "run"
    run.mkdir()
    cfg = config.from_dict({"node": {"id": "v", "run_dir": str(run)}, "model": {"spec": str(outside)}})
    (run / "config.toml").write_text(config.to_toml(cfg))
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from ftis_edge.store import rundir; "
            f"rundir.load_config({str(run)!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "outside the run directory" in r.stderr and str(outside.resolve()) in r.stderr, r.stderr
    assert rundir.load_config(run).model.spec == str(outside)


def test_the_opt_in_names_a_folder_by_its_absolute_path_not_the_spec_string(tmp_path, monkeypatch):
    """Before: FTIS_TRUST_MODEL_CODE=./model matched the spec string, so it trusted every run
    directory whose config said ./model (whatever folder that was). Now a relative entry names
    nothing; an absolute one trusts that folder only; a hub id still matches by name."""
    from ftis_edge.models.model_code import trusted
    run = tmp_path / "someone-elses-run"
    evil = model_folder(run / "model", tmp_path / "PWNED")
    monkeypatch.chdir(run)
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, "./model")
    assert not trusted("./model", evil)
    with pytest.raises(ModelError):
        resolve_model("./model")
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, str(tmp_path / "mine" / "model"))   # another folder, same name
    assert not trusted("./model", evil)
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, str(evil.resolve()))
    assert trusted("./model", evil) and resolve_model("./model").spec == "./model"
    monkeypatch.setenv(TRUST_MODEL_CODE_ENV, "org/model")                     # a hub id: its name
    assert trusted("org/model", tmp_path / "hub-cache" / "snapshot")
    (run / "org" / "model").mkdir(parents=True)                              # ... unless that is a folder here
    assert not trusted("org/model", run / "org" / "model")
    assert not marker_ran(tmp_path)


def marker_ran(tmp_path) -> bool:
    return (tmp_path / "PWNED").exists()
