"""Backend facts live on the backend classes (generate/): nothing else in the package compares a
backend's name. Adding a backend is then one file and one line in generate/registry.py."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ftis_edge.generate.registry import BACKENDS, DEFAULT, backend_class, pick_auto, resolve
from procs import ROOT

PACKAGE = Path(ROOT) / "ftis_edge"


def _names(node: ast.AST) -> list[str]:
    """The backend names a compared operand spells out ("hf", or ("llamacpp", ...))."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in BACKENDS]


def name_branches(source: str) -> list[int]:
    """Lines that compare something with a backend's name (==, !=, in, not in, is)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
                   and any(_names(operand) for operand in [node.left, *node.comparators])})


def test_the_finder_sees_a_branch_on_a_backend_name():
    assert name_branches('if cfg.model.backend != "hf":\n    pass\nx = b in ("llamacpp", "x")\n') == [1, 3]
    assert name_branches('files["hf"] = "hf/"\nsave(out / "hf")\nbackend = "auto"\n') == []


def test_no_backend_name_branches_outside_generate():
    found = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if "generate" not in p.relative_to(PACKAGE).parts
             and (lines := name_branches(p.read_text(encoding="utf-8")))}
    assert found == {}, f"backend names compared outside generate/ (ask the backend class instead): {found}"


def test_each_backend_class_says_its_facts():
    llama, hf = backend_class("llamacpp"), backend_class("hf")
    assert resolve("auto") == DEFAULT == "llamacpp" and resolve("hf") == "hf"
    assert llama.gguf_weights and not hf.gguf_weights
    assert llama.lora_problem(["q_proj", "v_proj"]) is None and hf.lora_problem(["qkv_proj"]) is None
    assert llama.lora_problem(["q_proj", "qkv_proj"]).startswith("'qkv_proj' cannot be written as a llama.cpp")
    assert llama.gpu_problem("cpu") is None and hf.gpu_problem("cuda") is None
    assert pick_auto("cpu") == (DEFAULT, None)
    assert "quantized" in llama.weight_precisions and "quantized" not in hf.weight_precisions
    assert not llama.memory_on_learner_device and hf.memory_on_learner_device


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_the_fit_estimate_takes_the_generators_memory_from_its_class(name):
    from ftis_edge.learn import fit
    shape = fit.shape_from_hf_config(fit.KNOWN_SHAPES["Qwen2.5-0.5B"], "Qwen2.5-0.5B")
    setup = fit.Setup(backend=name, device="cuda")
    est = fit.estimate(shape, setup)
    own = backend_class(name).memory(shape, setup, setup.group * 384)     # 256 + 128 tokens: a multiple of 64
    where = est.vram if backend_class(name).memory_on_learner_device else est.ram
    assert {k: where[k] for k in own} == own and own["kv cache"] > 0


def test_eval_of_a_run_directory_asks_the_backend_whether_it_reads_gguf(tmp_path):
    from ftis_edge import evaluate
    from ftis_edge.store import rundir
    (tmp_path / rundir.CONFIG_FILE).write_text("")
    with pytest.raises(evaluate.EvalError, match=r"GGUF weights on llamacpp; for --backend hf, `ftis-edge export"):
        evaluate._run_dir_weights(evaluate.EvalSpec(model=str(tmp_path), backend="hf"))
