"""The architecture matrix, verified offline with tiny random-weight models and llama.cpp's own converter.

For each supported architecture (llama incl. Llama-3 rope scaling and Mistral, qwen2, qwen3, gemma3,
phi3; GQA; tied and untied embeddings): build a 2-layer model from its transformers config, convert it
with llama.cpp's ``convert_hf_to_gguf.py`` (kept by install.sh), then after a real LoRA step check that
llama.cpp F16 + the hot-swapped GGUF LoRA adapter, the merged LoRA export and the merged export after
a full fine-tuning step all give PyTorch's per-token log-probs (mean |Δ| ≤ 0.01 nats), that the
adapter written with the wrong q/k layout does not, that transformers loads the converted GGUF back,
and that the HF backend's recorded log-probs are the learner's.

The vocabulary is SmolLM2's (49152 tokens; the converter recognises its pre-tokenizer; qwen2: a
SentencePiece vocabulary trained here, see ``_SentencePieceVocab``), so a model is ~3.3 M parameters.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from ftis_edge.models.gguf_io import (GGUFError, arch_layout, convert_hf_to_gguf, converter_dir, export_merged_gguf,
                               gguf_arch_of, lora_targets_for, read_gguf_metadata, write_gguf_lora)
from scoring import cpp_scores, hf_scores, mean_abs

needs_converter = pytest.mark.skipif(not (converter_dir() / "convert_hf_to_gguf.py").is_file(),
                                     reason="llama.cpp's converter is not installed (./install.sh keeps it)")

BAR = 0.01          # nats/token, mean |Δ log p|
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
           "Question: What is 12 times 7?\nAnswer:"]
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15)

# name -> (transformers config class, extra config, expected GGUF architecture)
CASES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False), "llama"),
    "llama3-rope-tied": ("LlamaConfig", dict(tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128}), "llama"),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False), "llama"),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), "qwen2"),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=16), "qwen3"),
    # head_dim = query_pre_attn_scalar = 256 as in Gemma 3 270M-12B (the GGUF does not store the scalar)
    "gemma3": ("Gemma3TextConfig", dict(tie_word_embeddings=True, head_dim=256, query_pre_attn_scalar=256),
               "gemma3"),
    "phi3": ("Phi3Config", dict(tie_word_embeddings=False), "phi3"),
}
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def tokenizer():
    from ftis_edge.models.resolve import resolve_model
    return resolve_model("smollm2-135m").tokenizer()


class _SentencePieceVocab:
    """A 1000-piece SentencePiece BPE vocabulary trained here, for qwen2: transformers 5 always reads a
    qwen2 directory's tokenizer.json as Qwen2Tokenizer (Qwen's regex), which turns SmolLM2's vocabulary
    into one the converter cannot identify; with a tokenizer.model it takes the SentencePiece path."""

    def __init__(self, hf_dir):
        import io

        import sentencepiece as spm

        import ftis_edge
        corpus = [line for f in sorted(Path(ftis_edge.__file__).parent.rglob("*.py"))
                  for line in f.read_text().splitlines() if line.strip()]
        proto = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=proto, vocab_size=1000,
                                       model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2,
                                       pad_id=-1, minloglevel=2)
        (hf_dir / "tokenizer.model").write_bytes(proto.getvalue())
        self.sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, None

    def __len__(self):
        return self.sp.get_piece_size()

    def __call__(self, text):
        return types.SimpleNamespace(input_ids=[1] + self.sp.encode(text))

    def decode(self, ids, **_):
        return self.sp.decode(list(ids))


def _build(case: str, tokenizer, root):
    import transformers
    cls_name, extra, _ = CASES[case]
    hf_dir = root / case
    hf_dir.mkdir(parents=True)
    if case == "qwen2":
        tokenizer = _SentencePieceVocab(hf_dir)
    else:
        tokenizer.save_pretrained(hf_dir)
    if case == "phi3":       # llama.cpp's phi3 vocabulary loader looks up Phi-3's special tokens by name
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        tokenizer.add_special_tokens({"additional_special_tokens": [
            "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "</s>", "<unk>", "<s>"]})
        tokenizer.save_pretrained(hf_dir)
    cfg = getattr(transformers, cls_name)(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
                                          **COMMON, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(hf_dir)
    if case != "qwen2":    # phi3's converter reads a GPT-2 style vocabulary only when the config says so
        tc = json.loads((hf_dir / "tokenizer_config.json").read_text())
        (hf_dir / "tokenizer_config.json").write_text(json.dumps({**tc, "tokenizer_class": "GPT2Tokenizer"}))
    return hf_dir, tokenizer


def _step(learner, samples):
    from ftis_edge.rollout.samples import TrainSample
    batch = [TrainSample(s.prompt_ids, s.completion_ids, s.gen_logprobs, None, 1.0 if i % 2 == 0 else -1.0)
             for i, s in enumerate(samples)]
    stats = learner.step(batch)
    assert not stats.get("skipped")


# ~30-50 s per architecture on 2 cores (the converter, llama.cpp and two learners each): the README's
# test command converts qwen2 (the SentencePiece path); the other six, llama included (the default
# model's own GGUF is exercised by most real-model tests), run in CI's slow tier (pytest -m slow)
ALWAYS = ("qwen2",)


@pytest.mark.model
@needs_converter
@pytest.mark.parametrize("case", [c if c in ALWAYS else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_architecture_round_trip(case, tokenizer, tmp_path):
    from ftis_edge.generate.base import SamplerSettings
    from ftis_edge.generate.hf import HFGenerator
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.learn.learner import Learner, TrainSample

    torch.set_num_threads(1)
    hf_dir, tokenizer = _build(case, tokenizer, tmp_path)
    model_type = json.loads((hf_dir / "config.json").read_text())["model_type"]
    arch = gguf_arch_of(model_type)
    assert arch == CASES[case][2]
    gguf_path = convert_hf_to_gguf(hf_dir, tmp_path / f"{case}.f16.gguf", outtype="f16")
    meta = read_gguf_metadata(gguf_path)
    assert meta["arch"] == arch and meta["n_head_kv"] == 2
    heads = dict(arch=arch, n_head=meta["n_head"], n_head_kv=meta["n_head_kv"])
    eos = [tokenizer.eos_token_id]

    learner = Learner(hf_dir, trainable="lora", lora_targets=lora_targets_for(arch, ALL_TARGETS), lr=5e-3, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():     # a large adapter, so that agreeing on it means something
        for p in learner.trainable_state().values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    gen = LlamaCppGenerator(gguf_path, eos_token_ids=eos, n_ctx=160, max_group=4, n_threads=1)
    gen.set_adapter(str(write_gguf_lora(learner.model, tmp_path / "pre.gguf", **heads)), 0)
    samples = []
    for i, text in enumerate(PROMPTS):
        ids = tokenizer(text).input_ids
        for c in gen.generate(ids, 3, SamplerSettings(temperature=1.0, max_new_tokens=20, seed=i)):
            samples.append(TrainSample(ids, c.token_ids, c.logprobs, None, 0.0))
    _step(learner, samples)                                      # a real F-TIS step on llama.cpp's samples
    r = RESULTS.setdefault(case, {"arch": arch, "tokens": sum(len(s.completion_ids) for s in samples)})

    hf_lora = hf_scores(learner, samples)
    with learner.model.disable_adapter():
        hf_base = hf_scores(learner, samples)
    r["adapter_effect"] = mean_abs(hf_lora, hf_base)
    gen.set_adapter(None, 0)
    r["base"] = mean_abs(cpp_scores(gen, samples), hf_base)
    gen.set_adapter(str(write_gguf_lora(learner.model, tmp_path / "v1.gguf", **heads)), 1)
    r["adapter"] = mean_abs(cpp_scores(gen, samples), hf_lora)
    # the other q/k layout (permuted where the converter does not, and vice versa) must not pass;
    # phi3 has no separate q/k projections (fused qkv_proj, never permuted)
    if "q_proj" in lora_targets_for(arch, ALL_TARGETS):
        wrong = write_gguf_lora(learner.model, tmp_path / "wrong.gguf", permute=not arch_layout(arch).permute_qk,
                                **heads)
        gen.set_adapter(str(wrong), 1)
        r["wrong_layout"] = mean_abs(cpp_scores(gen, samples), hf_lora)
    merged = export_merged_gguf(learner.model, gguf_path, tmp_path / "merged-lora.gguf", dtype="f16")
    gen.set_adapter(None, 1)
    gen.reload(str(merged), 1)
    r["merged_lora"] = mean_abs(cpp_scores(gen, samples), hf_lora)

    # the HF backend samples from the learner itself: its recorded log-probs are the learner's
    hf_gen = HFGenerator(learner.model, tokenizer, eos_token_ids=eos)
    comps = hf_gen.generate(samples[0].prompt_ids, 2, SamplerSettings(temperature=1.0, max_new_tokens=12, seed=5))
    hf_samples = [TrainSample(samples[0].prompt_ids, c.token_ids, c.logprobs, None, 0.0) for c in comps]
    r["hf_backend"] = mean_abs([np.asarray(c.logprobs) for c in comps], hf_scores(learner, hf_samples))
    del learner

    full = Learner(hf_dir, trainable="full", lr=1e-3, seed=0)
    before = hf_scores(full, samples)
    _step(full, samples)
    after = hf_scores(full, samples)
    r["full_step_effect"] = mean_abs(after, before)
    merged = export_merged_gguf(full.model, gguf_path, tmp_path / "merged-full.gguf", dtype="f32")
    gen.reload(str(merged), 2)
    r["merged_full"] = mean_abs(cpp_scores(gen, samples), after)
    gen.close()

    # GGUF -> PyTorch: what bundle.hf_dir() loads (transformers' GGUF loader + our fixes), F16 weights
    from transformers import AutoModelForCausalLM

    from ftis_edge.models.resolve import gguf_to_pytorch
    back = gguf_to_pytorch(gguf_path)
    orig = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    ids = torch.tensor([samples[0].prompt_ids + samples[0].completion_ids])
    with torch.no_grad():
        a, b = back(ids).logits.log_softmax(-1), orig(ids).logits.log_softmax(-1)
    r["gguf_to_pytorch"] = float((a - b).abs().mean())
    print(f"\n{case}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))

    assert r["adapter_effect"] > 0.1, r            # the adapter changes the policy a lot
    assert r["full_step_effect"] > 0.01, r         # and so does the full fine-tuning step
    assert r["base"] <= BAR, r
    assert r["adapter"] <= BAR, r
    assert r["merged_lora"] <= BAR, r
    assert r["merged_full"] <= BAR, r
    assert r.get("wrong_layout", 1.0) > 5 * BAR, r     # the layout check can fail
    assert r["hf_backend"] <= 1e-4, r
    assert r["gguf_to_pytorch"] <= BAR, r


def test_unknown_architecture_is_refused_with_the_supported_list():
    with pytest.raises(GGUFError, match="supported: llama .*qwen2.*qwen3.*gemma3.*phi3"):
        arch_layout("mamba")
    assert gguf_arch_of("mistral") == "llama" and gguf_arch_of("gemma3_text") == "gemma3"
    assert gguf_arch_of("mamba") is None
    assert lora_targets_for("phi3", ALL_TARGETS) == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert lora_targets_for("qwen2", ALL_TARGETS) == list(ALL_TARGETS)
