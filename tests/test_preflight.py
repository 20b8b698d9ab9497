"""Start-up cross-checks: config vs the real model's metadata and tokenizer, one line each,
before any weights load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ftis_edge.run import preflight
from ftis_edge.config import ConfigError, from_dict
from ftis_edge.models.resolve import resolve_model
from ftis_edge.tasks import get_task
from procs import ROOT


@pytest.fixture(scope="module")
def smol():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def arith():
    return get_task("arith")


def test_smoke_the_default_node_passes_preflight_raising_nothing(smol, arith):     # a smoke test: no assert
    preflight.check(from_dict({}), smol, arith)


def test_max_completion_length_beyond_the_trained_context_names_the_key_and_the_room_left(smol, arith):
    assert preflight.backend_of(from_dict({})).context_limit is None    # llama.cpp's context grows with the task
    cfg = from_dict({"task": {"max_completion_length": 9000}})
    with pytest.raises(ConfigError) as e:
        preflight.check(cfg, smol, arith)
    msg = str(e.value)
    assert msg.startswith("task.max_completion_length: 9000 new tokens after a ")
    assert "the model's trained context of 8192 tokens" in msg and "use at most" in msg
    room = int(msg.split("use at most ")[1].split()[0])
    # (the context only: memory for such lengths is check_fit's, which may refuse them on a small machine)
    preflight.check_lengths(from_dict({"task": {"max_completion_length": room}}), smol, arith)     # exactly fits
    # no fixed 2048-token llama.cpp context any more: 4000 new tokens fit on both backends
    preflight.check_lengths(from_dict({"task": {"max_completion_length": 4000}}), smol, arith)
    preflight.check_lengths(from_dict({"task": {"max_completion_length": 4000}, "model": {"backend": "hf"}}), smol,
                            arith)


def test_lora_targets_the_gguf_writer_does_not_know(smol, arith):
    cfg = from_dict({"train": {"lora_targets": ["q_proj", "qkv_proj"]}})
    with pytest.raises(ConfigError, match=r"^train.lora_targets: 'qkv_proj' cannot be written as a llama.cpp"):
        preflight.check(cfg, smol, arith)
    cfg = from_dict({"train": {"lora_targets": ["query"]}, "model": {"backend": "hf"}})
    with pytest.raises(ConfigError, match=r"^train.lora_targets: llama has no 'query' layer"):
        preflight.check(cfg, smol, arith)
    # full fine-tuning has no targets to check
    preflight.check(from_dict({"train": {"lora_targets": ["query"], "trainable": "full"}}), smol, arith)


def test_an_hf_only_model_on_the_llamacpp_backend(smol, arith):
    hf = resolve_model(str(smol.hf_dir()))
    with pytest.raises(ConfigError, match=r'^model.backend: .* is an HF model without a GGUF file.*"hf"'):
        preflight.check(from_dict({"model": {"spec": str(smol.hf_dir())}}), hf, arith)
    preflight.check(from_dict({"model": {"spec": str(smol.hf_dir()), "backend": "hf"}}), hf, arith)


def test_a_bad_hub_id_and_a_bad_setting_fail_the_cli_in_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run"\n[model]\nspec = "nobody-xyz/no-such-model"\n')
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(path), "--headless"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ftis-edge: error: model 'nobody-xyz/no-such-model': not in the local HF cache")
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run2"\n[task]\nmax_completion_length = 30000\n')
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(path), "--headless"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ftis-edge: error: task.max_completion_length: 30000 new tokens")


def test_auto_engines_on_this_machine():
    from ftis_edge.run import devices
    import torch
    device = devices.pick_device("auto")
    assert device == ("cuda" if torch.cuda.is_available() else "cpu") or device == "mps"
    # a GPU learner with a CPU-only llama.cpp generates with HF, and says why in one line
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    if not LlamaCppGenerator.has_gpu():
        backend, why = devices.pick_backend("auto", "cuda")
        assert backend == "hf" and "\n" not in why
        assert why == ("model.backend auto: hf — the learner is on cuda and this llama.cpp build is CPU-only "
                       "(install the CUDA toolkit and re-run ./install.sh for a GPU llama.cpp)")
    assert devices.pick_backend("auto", "cpu") == ("llamacpp", None)
    assert devices.pick_backend("hf", "cpu") == ("hf", None)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^model.device: cuda, but torch sees no CUDA GPU"):
            devices.pick_device("cuda")


def test_the_memory_estimate_is_said_at_start_up_with_the_real_prompt_length(smol, arith, caplog):
    """preflight.check_fit: the first round's real prompt length goes into fit.py's estimate, said in one line."""
    import logging

    from ftis_edge.learn import fit
    cfg = from_dict({"train": {"trainable": "full"}})
    with caplog.at_level(logging.INFO, logger="ftis_edge.run.preflight"):
        ok, line = preflight.check_fit(cfg, smol, arith)
    assert [r.getMessage() for r in caplog.records] == [f"memory: {line}"] and "\n" not in line
    prompt = preflight.longest_first_prompt(cfg, smol, arith)
    expected = fit.estimate(fit.shape_of(smol), fit.Setup.from_config(cfg, prompt_tokens=prompt))
    assert f"RAM {expected.ram_bytes / fit.GB:.1f} GB" in line and "full" in line
    assert ok == ("does not fit" not in line)


def test_a_need_beyond_the_machine_is_refused_before_loading_naming_what_dominates(tmp_path):
    """The default SmolLM2 node with huge batches, groups and lengths (a ~1 TB need): before, a warning
    advising "a smaller model" (it is the smallest), then llama.cpp failing on a 131072-token context;
    now one line naming the learner's activations and their settings, and no model loaded."""
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nrun_dir = "{tmp_path}/run"\n[train]\nmicro_batch = 256\n'
                    f'[task]\nnum_generations = 256\nmax_completion_length = 4096\n')
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(path), "--headless"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    err = r.stderr.strip().splitlines()[-1]
    # the model as the user called it (config.model_label), not the GGUF's general.name
    assert err.startswith("ftis-edge: error: memory: smollm2-135m") and "more than this machine's" in err
    assert "(not started)" in err
    assert len(err) < 400 and not err.endswith("…")
    assert "most of it is the learner's activations" in err and "train.micro_batch 256" in err
    assert "smaller model" not in err and "task.max_completion_length = " in err
    log = (tmp_path / "run" / "node.log").read_text()
    assert "loaded in" not in log                    # refused before the learner and generator load
