"""Will it fit? The shape readers, the estimate's arithmetic, the verdict and its advice, the generated table.

The estimate against real nodes' measured peak RSS is benchmarks/bench_fit.py (minutes of CPU).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from dataclasses import replace

import pytest

from ftis_edge.learn import fit
from ftis_edge.learn.fit import GB, Machine, Setup, check, estimate, shape_from_hf_config
from procs import ROOT as _ROOT

ROOT = Path(_ROOT)

# parameters on the model cards, for the shapes fit.KNOWN_SHAPES holds (Qwen2.5 has q/k/v biases: < 0.1%)
PUBLISHED = {"Qwen2.5-0.5B": 494e6, "Qwen2.5-1.5B": 1.54e9, "Qwen2.5-3B": 3.09e9, "Llama-3.2-1B": 1.24e9,
             "Llama-3.2-3B": 3.21e9, "Gemma-3-270M": 268e6, "SmolLM2-135M": 134.5e6}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_from_the_published_shapes_match_the_model_cards(name):
    shape = shape_from_hf_config(fit.KNOWN_SHAPES[name], name)
    assert abs(shape.n_params / PUBLISHED[name] - 1) < 0.01, shape.n_params


def test_the_gguf_header_gives_the_same_shape_as_the_config(tmp_path):
    """SmolLM2's shipped GGUF, read straight from its header (no weights), against its config.json shape."""
    from ftis_edge.models.resolve import resolve_model
    from_gguf = fit.shape_of(resolve_model("smollm2-135m"))
    from_cfg = shape_from_hf_config(fit.KNOWN_SHAPES["SmolLM2-135M"])
    for field in ("n_params", "hidden", "ffn", "n_layer", "n_head", "n_head_kv", "head_dim", "vocab"):
        assert getattr(from_gguf, field) == getattr(from_cfg, field), field
    assert 0 < from_gguf.file_bytes < 2 * from_gguf.n_params          # a quantized file: < 2 B per weight


def test_a_truncated_gguf_header_is_a_clear_error(tmp_path):
    from ftis_edge.models.gguf_io import GGUFError, read_gguf_header
    from ftis_edge.models.resolve import resolve_model
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(resolve_model("smollm2-135m").gguf_path.read_bytes()[:5000])
    with pytest.raises(GGUFError, match="ends early"):
        read_gguf_header(cut)


def test_the_estimate_moves_the_way_the_settings_do():
    shape = shape_from_hf_config(fit.KNOWN_SHAPES["Qwen2.5-1.5B"], "q")
    base = estimate(shape, Setup())
    full = estimate(shape, Setup(trainable="full"))
    assert full.ram["grads+adam"] == 12 * shape.n_params and full.ram_bytes > base.ram_bytes + 12 * shape.n_params
    assert full.ram["activations"] > base.ram["activations"]     # a trainable MLP keeps its linears' inputs
    half = estimate(shape, Setup(micro_batch=4))
    assert half.ram["activations"] < base.ram["activations"] and half.ram["weights"] == base.ram["weights"]
    assert estimate(shape, Setup(completion_tokens=512)).ram["kv cache"] > base.ram["kv cache"]
    on_gpu = estimate(shape, Setup(device="cuda", backend="hf", trainable="full"))
    assert "weights" in on_gpu.vram and "weights" not in on_gpu.ram and "gen weights" not in on_gpu.ram
    assert base.ram_bytes > base.ram["weights"] + base.ram["gen weights"]        # the parts add up
    assert "RAM" in base.line() and "learner" in base.line() and "generator" in base.line()


def test_a_model_that_does_not_fit_says_what_to_change():
    shape = shape_from_hf_config(fit.KNOWN_SHAPES["Qwen2.5-1.5B"], "Qwen2.5-1.5B")
    need_lora = estimate(shape, Setup()).ram_bytes
    need_full = estimate(shape, Setup(trainable="full")).ram_bytes
    ok, line = check(shape, Setup(trainable="full"), Machine(64 * GB, need_full * 2))
    assert ok and "does not fit" not in line
    # between the two: LoRA is the change that fits
    room = Machine(64 * GB, int((need_lora + need_full) / 2 / fit.HEADROOM))
    ok, line = check(shape, Setup(trainable="full"), room)
    assert not ok and line.endswith('try train.trainable = "lora"') and "\n" not in line
    # LoRA but too little room for its activations: a smaller micro-batch
    ok, line = check(shape, Setup(), Machine(64 * GB, int(need_lora * 0.8 / fit.HEADROOM)))
    assert not ok and "train.micro_batch = " in line
    ok, line = check(shape, Setup(), Machine(64 * GB, 1 * GB))
    assert not ok and line.endswith("a smaller model (model.spec; see docs/models.md)")


def test_the_machine_is_read_from_the_system():
    have = fit.machine()
    assert have.ram_total > 0 and 0 < have.ram_available <= have.ram_total and have.vram_total is None


def test_the_models_doc_is_generated_from_the_estimator():
    table = fit.models_table()
    for name in fit.KNOWN_SHAPES:
        assert f"| {name} |" in table
    assert fit.models_table() in (ROOT / "docs" / "models.md").read_text(encoding="utf-8")


def test_init_prints_the_estimate_for_this_machine(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "init", str(tmp_path / "n.toml")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "memory: " in r.stdout and "GB RAM free" in r.stdout and "docs/models.md" in r.stdout


def test_setup_from_a_config():
    from ftis_edge.config import Config
    cfg = Config()
    cfg = replace(cfg, train=replace(cfg.train, trainable="full", micro_batch=2))
    s = Setup.from_config(cfg, prompt_tokens=200)
    assert (s.trainable, s.micro_batch, s.prompt_tokens, s.group, s.backend, s.device) == \
        ("full", 2, 200, cfg.task.num_generations, "llamacpp", "cpu")


def test_the_example_lines_in_docs_gpu_md_are_the_estimator_s():
    """docs/gpu.md quotes two `memory:` lines (Qwen2.5-1.5B, a 32 GB PC with 24 GB free): still what fit.py says."""
    doc = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    shape = shape_from_hf_config(fit.KNOWN_SHAPES["Qwen2.5-1.5B"], "Qwen2.5-1.5B-Instruct")
    have = Machine(32 * GB, int(24.0 * GB))
    for trainable in ("full", "lora"):
        assert f"memory: {check(shape, Setup(trainable=trainable), have)[1]}" in doc
