"""Learner -> llama.cpp sync: GGUF LoRA adapters, merged GGUF exports, hot swap.

Acceptance bars (real SmolLM2-135M and Gemma 3 270M): after a real training step, llama.cpp + the GGUF
adapter agrees with PyTorch + LoRA per token (mean |Δlogp| < 0.1 on the quantized base, < 0.01 on the
F16 base; the adapter's effect correlates > 0.95 between engines); the adapter written without the llama
q/k permutation fails that bar; a merged F16 export after a full fine-tuning step agrees < 0.01; a hot
swap is applied in place and removing the adapter restores the base exactly (how fast a swap is:
benchmarks/sync_agreement.py, docs/benchmarks.md).
"""

import numpy as np
import pytest
import torch

from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.run.sync import SyncError, WeightSync, export_merged_gguf, permute_rows, write_gguf_lora
from scoring import cpp_scores, hf_scores, mean_abs

torch.set_num_threads(2)

PROMPTS = ["Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
           "Question: A shop sells pens at 2 dollars each. How much do 7 pens cost?\nAnswer:"]


# ------------------------------------------------------------------ helpers

def _corr(x, y) -> float:
    return float(np.corrcoef(np.concatenate(x), np.concatenate(y))[0, 1])


def _diff(a, b):
    return [x - y for x, y in zip(a, b)]


def _perturb_lora(learner, std=0.05, seed=1):
    """Large random LoRA matrices, so the adapter changes log-probs by ~0.3-0.6 nats per token."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.trainable_state().values():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _tiny_peft(arch: str, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")):
    """A randomly initialised 2-layer model of the given family with a LoRA (no weights downloaded)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma3TextConfig, LlamaConfig
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100)
    cfg = LlamaConfig(**common) if arch == "llama" else Gemma3TextConfig(head_dim=16, **common)
    model = AutoModelForCausalLM.from_config(cfg)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.1)
    return peft_model


# ------------------------------------------------------------------ fast tests (tiny random models)

def test_permutation_is_the_inverse_of_transformers_gguf_loader():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for n_head in (1, 2, 3, 6):
        unpermuted = LlamaTensorProcessor()._reverse_permute_weights(permute_rows(w, n_head), n_head)
        np.testing.assert_array_equal(unpermuted, w)
    with pytest.raises(SyncError, match="heads"):
        permute_rows(w, 5)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gguf_lora_file_layout(tmp_path, arch):
    import gguf
    model = _tiny_peft(arch)
    path = write_gguf_lora(model, tmp_path / "a.gguf", arch=arch, n_head=4, n_head_kv=2)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["general.architecture"].contents() == arch
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    assert len(tensors) == 2 * 2 * 7
    layer1 = model.get_base_model().model.layers[1]
    for short, stem in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                        ("o_proj", "attn_output")):
        lora = getattr(layer1.self_attn, short)
        a = lora.lora_A["default"].weight.detach().numpy()
        b = lora.lora_B["default"].weight.detach().numpy()
        np.testing.assert_array_equal(tensors[f"blk.1.{stem}.weight.lora_a"], a)
        if arch == "llama" and short in ("q_proj", "k_proj"):
            b = permute_rows(b, 4 if short == "q_proj" else 2)
        np.testing.assert_array_equal(tensors[f"blk.1.{stem}.weight.lora_b"], b)
    mlp = layer1.mlp.down_proj
    np.testing.assert_array_equal(tensors["blk.1.ffn_down.weight.lora_b"],
                                  mlp.lora_B["default"].weight.detach().numpy())
    assert not list(tmp_path.glob(".*.tmp"))              # atomic: no temp file left behind


def test_unsupported_lora_target_is_refused_and_leaves_no_file(tmp_path):
    model = _tiny_peft("llama", targets=("q_proj", "lm_head"))
    with pytest.raises(SyncError, match="lm_head"):
        write_gguf_lora(model, tmp_path / "a.gguf", arch="llama", n_head=4, n_head_kv=2)
    assert list(tmp_path.iterdir()) == []


def test_merged_export_refuses_an_unsupported_dtype(tmp_path):
    with pytest.raises(SyncError, match="dtype"):
        export_merged_gguf(None, tmp_path / "base.gguf", tmp_path / "out.gguf", dtype="q4")


# ------------------------------------------------------------------ SmolLM2 (llama architecture)

@pytest.fixture(scope="module")
def smol():
    """A LoRA learner after a real F-TIS step, its GGUF adapters, the completions and both engines' scores."""
    from ftis_edge.generate.base import SamplerSettings
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.models.resolve import resolve_model

    bundle = resolve_model("smollm2-135m")
    learner = Learner(bundle.hf_dir(), trainable="lora", lr=1e-3, seed=0)
    _perturb_lora(learner)
    kw = dict(n_ctx=128, max_group=2, n_threads=2, eos_token_ids=bundle.eos_token_ids)
    gen_f16 = LlamaCppGenerator(bundle.f16_gguf(), **kw)
    gen_q = LlamaCppGenerator(bundle.gguf_path, **kw)
    out = type("Smol", (), {})()
    out.bundle, out.learner, out.gen_f16, out.gen_q = bundle, learner, gen_f16, gen_q
    out.tmp = __import__("tempfile").mkdtemp(prefix="ftis-sync-")
    lora_kw = dict(arch=bundle.arch, n_head=bundle.n_head, n_head_kv=bundle.n_head_kv)

    # completions sampled by llama.cpp from the current policy, then one real training step on them
    gen_f16.set_adapter(write_gguf_lora(learner.model, f"{out.tmp}/v0.gguf", **lora_kw), 0)
    samples = []
    for i, text in enumerate(PROMPTS):
        ids = bundle.encode(text)
        for j, c in enumerate(gen_f16.generate(ids, 2, SamplerSettings(max_new_tokens=32, seed=i))):
            samples.append(TrainSample(ids, c.token_ids, c.logprobs, None, 1.0 if j % 2 == 0 else -1.0))
    before = {n: p.detach().clone() for n, p in learner.trainable_state().items()}
    out.step_stats = learner.step(samples)
    out.step_changed = any(not torch.equal(p, before[n]) for n, p in learner.trainable_state().items())
    out.samples = samples
    out.adapter = write_gguf_lora(learner.model, f"{out.tmp}/v1.gguf", **lora_kw)
    out.adapter_noperm = write_gguf_lora(learner.model, f"{out.tmp}/v1-noperm.gguf", permute=False, **lora_kw)
    out.hf_lora = hf_scores(learner, samples)
    with learner.model.disable_adapter():
        out.hf_base = hf_scores(learner, samples)
    out.hf_effect = _diff(out.hf_lora, out.hf_base)
    out.cpp = {}
    for label, gen in (("q4", gen_q), ("f16", gen_f16)):
        gen.set_adapter(None, 0)
        out.cpp[label, "base"] = cpp_scores(gen, samples)
        gen.set_adapter(out.adapter, 1)
        out.cpp[label, "lora"] = cpp_scores(gen, samples)
        gen.set_adapter(out.adapter_noperm, 1)
        out.cpp[label, "noperm"] = cpp_scores(gen, samples)
        gen.set_adapter(None, 0)
    yield out
    gen_f16.close()
    gen_q.close()
    __import__("shutil").rmtree(out.tmp, ignore_errors=True)


def _report(smol, label, kind):
    scores = smol.cpp[label, kind]
    return mean_abs(scores, smol.hf_lora), _corr(_diff(scores, smol.cpp[label, "base"]), smol.hf_effect)


@pytest.mark.model
def test_the_adapter_is_trained_and_its_effect_is_large(smol):
    assert smol.step_changed and smol.step_stats["skipped"] == 0
    effect = float(np.abs(np.concatenate(smol.hf_effect)).mean())
    assert effect > 0.2, effect                    # sensitive test: the adapter moves log-probs a lot


@pytest.mark.model
def test_quantized_base_plus_adapter_agrees_with_pytorch(smol):
    mean, corr = _report(smol, "q4", "lora")
    assert mean < 0.1 and corr > 0.95, (mean, corr)


@pytest.mark.model
def test_f16_base_plus_adapter_agrees_with_pytorch(smol):
    mean, corr = _report(smol, "f16", "lora")
    assert mean < 0.01 and corr > 0.99, (mean, corr)
    assert mean_abs(smol.cpp["f16", "base"], smol.hf_base) < 0.01


@pytest.mark.model
def test_adapter_without_the_qk_permutation_fails_the_bar(smol):
    q_mean, q_corr = _report(smol, "q4", "noperm")
    f_mean, f_corr = _report(smol, "f16", "noperm")
    assert not (q_mean < 0.1 and q_corr > 0.95), (q_mean, q_corr)
    assert f_mean > 0.05 and f_corr < 0.95, (f_mean, f_corr)


@pytest.mark.model
def test_weight_sync_hot_swaps_fast_and_removal_restores_the_base_exactly(smol, tmp_path):
    gen = smol.gen_f16
    sync = WeightSync.from_bundle(smol.learner, gen, smol.bundle, tmp_path, mode="auto", keep=2)
    assert sync.mode == "lora-adapter"
    infos = [sync.sync(version=v) for v in (1, 2, 3)]
    for info in infos:          # hang guards: a swap is milliseconds (benchmarks/sync_agreement.py)
        assert info["sync/apply_s"] < 5.0 and info["sync/write_s"] < 10.0, info
        assert info["sync/bytes"] > 100_000
    assert gen.adapter_version == 3 and gen.adapter_path == infos[-1]["sync/path"]
    names = ["adapter-v000002.gguf", "adapter-v000003.gguf", "latest.gguf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    assert (tmp_path / "latest.gguf").read_bytes() == (tmp_path / "adapter-v000003.gguf").read_bytes()
    # Rounds without an optimiser step sync the same version: nothing is written or deleted
    # (two in a row used to delete the adapter in use).
    for _ in range(3):
        again = sync.sync(version=3)
        assert again["sync/bytes"] == 0 and again["sync/path"] == infos[-1]["sync/path"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    synced = cpp_scores(gen, smol.samples)        # same weights as the v1 adapter file: same numbers
    assert all(np.array_equal(a, b) for a, b in zip(synced, smol.cpp["f16", "lora"]))
    gen.set_adapter(None, 0)
    restored = cpp_scores(gen, smol.samples)
    assert all(np.array_equal(a, b) for a, b in zip(restored, smol.cpp["f16", "base"]))


@pytest.mark.model
def test_weight_sync_is_a_no_op_for_the_hf_backend(smol, tmp_path):
    from ftis_edge.generate.hf import HFGenerator
    gen = HFGenerator(smol.learner.model, smol.bundle.tokenizer())
    info = WeightSync.from_bundle(smol.learner, gen, smol.bundle, tmp_path).sync(version=7)
    assert info["sync/mode"] == "none" and info["sync/bytes"] == 0 and gen.adapter_version == 7
    # nothing for the generator, but a stable latest.gguf for people (eval, export)
    assert [p.name for p in tmp_path.iterdir()] == ["latest.gguf"]


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_merged_export_after_a_full_fine_tuning_step_agrees(smol, tmp_path):
    full = Learner(smol.bundle.hf_dir(), trainable="full", lr=2e-5, seed=0)
    with pytest.raises(SyncError, match="LoRA learner"):
        WeightSync.from_bundle(full, smol.gen_f16, smol.bundle, tmp_path, mode="lora-adapter")
    before = hf_scores(full, smol.samples)
    full.step(smol.samples)
    after = hf_scores(full, smol.samples)
    step_effect = _diff(after, before)
    assert np.abs(np.concatenate(step_effect)).mean() > 0.02        # the step really changed the policy
    sync = WeightSync.from_bundle(full, smol.gen_f16, smol.bundle, tmp_path)
    assert sync.mode == "merged" and sync.dtype == "f32"   # F16 would round a 2e-5 step away (see sync.py)
    info = sync.sync()
    assert info["sync/version"] == 1 and info["sync/bytes"] > 400e6
    assert smol.gen_f16.adapter_version == 1
    try:
        merged = cpp_scores(smol.gen_f16, smol.samples)
        mean = mean_abs(merged, after)
        assert mean < 0.01, mean
        assert _corr(_diff(merged, before), step_effect) > 0.99
    finally:
        smol.gen_f16.reload(smol.bundle.f16_gguf(), 0)


# ------------------------------------------------------------------ Gemma 3 (no permutation, norm +1)

@pytest.mark.slow       # Gemma's adapter and merged-export round trip end to end: CI's slow tier
@pytest.mark.model
def test_gemma3_adapter_and_merged_export_round_trip(tmp_path):
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.models.resolve import resolve_model

    bundle = resolve_model("gemma3-270m")
    learner = Learner(bundle.hf_dir(), trainable="lora", seed=0)
    _perturb_lora(learner, std=0.02)
    texts = [("Tom has 3 apples and buys 5 more. How many apples does he have?",
              " He has 3 + 5 = 8 apples, so the answer is 8."),
             ("The capital of France is", " Paris, which is also the largest city of the country.")]
    tok = bundle.tokenizer()
    samples = [TrainSample(bundle.encode(p), tok(c, add_special_tokens=False).input_ids, None, 0.0, 0.0,
                           sequence_level=True) for p, c in texts]
    hf_lora = hf_scores(learner, samples)
    with learner.model.disable_adapter():
        hf_base = hf_scores(learner, samples)
    gen = LlamaCppGenerator(bundle.f16_gguf(), n_ctx=128, max_group=2, n_threads=2)
    try:
        base = cpp_scores(gen, samples)
        adapter = write_gguf_lora(learner.model, tmp_path / "g.gguf", arch=bundle.arch,
                                  n_head=bundle.n_head, n_head_kv=bundle.n_head_kv)
        gen.set_adapter(adapter, 1)
        with_adapter = cpp_scores(gen, samples)
        effect = float(np.abs(np.concatenate(_diff(hf_lora, hf_base))).mean())
        mean = mean_abs(with_adapter, hf_lora)
        corr = _corr(_diff(with_adapter, base), _diff(hf_lora, hf_base))
        assert effect > 0.1 and mean < 0.01 and corr > 0.99, (effect, mean, corr)
        # merged export (LoRA folded in; norms get their +1 back): the same policy from one file
        merged = export_merged_gguf(learner.model, bundle.gguf_path, tmp_path / "merged.gguf")
        gen.reload(merged, 1)
        mean_merged = mean_abs(cpp_scores(gen, samples), hf_lora)
        assert mean_merged < 0.01, mean_merged
    finally:
        gen.close()
