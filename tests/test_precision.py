"""The learner's precision rule (learn/precision.py), checked without a model: the dtype a step
computes in, what fit.py sizes by it, and the start-up warning for an emulated bf16."""
from __future__ import annotations

import pytest

from ftis_edge import config
from ftis_edge.learn import fit
from ftis_edge.learn.precision import PRECISIONS, activation_bytes, compute_dtype, slow_note


def test_auto_is_bf16_on_cuda_only_and_an_explicit_choice_holds_everywhere():
    table = {(d, p): compute_dtype(d, p) for d in ("cpu", "cuda", "mps") for p in PRECISIONS}
    assert table == {("cpu", "auto"): "fp32", ("cuda", "auto"): "bf16", ("mps", "auto"): "fp32",
                     ("cpu", "fp32"): "fp32", ("cuda", "fp32"): "fp32", ("mps", "fp32"): "fp32",
                     ("cpu", "bf16"): "bf16", ("cuda", "bf16"): "bf16", ("mps", "bf16"): "bf16"}
    assert [activation_bytes("cpu", p) for p in PRECISIONS] == [4, 4, 2]
    with pytest.raises(ValueError, match="precision must be one of"):
        compute_dtype("cpu", "fp16")


def test_bf16_on_a_cpu_that_emulates_it_is_said_and_nowhere_else():
    note = slow_note("cpu", "bf16", cpu_has_bf16=False)
    assert note.startswith('train.precision = "bf16" on a CPU without avx512_bf16 / AMX') and '"auto"' in note
    assert slow_note("cpu", "bf16", cpu_has_bf16=True) is None         # native bf16: faster, nothing to say
    assert slow_note("cpu", "bf16", cpu_has_bf16=None) is None         # /proc/cpuinfo unreadable: no guess
    assert slow_note("cuda", "bf16", cpu_has_bf16=False) is None       # the GPU does the matmuls
    assert all(slow_note("cpu", p, cpu_has_bf16=False) is None for p in ("auto", "fp32"))


def test_fit_sizes_the_activations_by_the_learners_rule():
    shape = fit.shape_from_hf_config(fit.KNOWN_SHAPES["SmolLM2-135M"], "SmolLM2-135M")
    act = {(d, p): fit.estimate(shape, fit.Setup(device=d, train_precision=p)).ram.get("activations")
           or fit.estimate(shape, fit.Setup(device=d, train_precision=p)).vram["activations"]
           for d in ("cpu", "cuda") for p in PRECISIONS}
    assert act[("cpu", "bf16")] * 2 == act[("cpu", "auto")] == act[("cpu", "fp32")]       # CPU bf16: autocast too
    assert act[("cuda", "auto")] == act[("cuda", "bf16")] == act[("cpu", "bf16")]
    assert act[("cuda", "fp32")] == act[("cpu", "fp32")]                                 # fp32 asked: kept
    cfg = config.from_dict({"train": {"precision": "bf16"}, "model": {"device": "cpu"}})
    assert fit.Setup.from_config(cfg).train_precision == "bf16"
