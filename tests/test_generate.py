"""Generators: the behaviour log-prob contract, seeding, EOS convention, engine agreement, adapters."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ftis_edge.generate.base import SamplerSettings
from ftis_edge.generate.sampling import (GenerationError, check_sampler, processed_logprobs,
                                         sample_tokens)

THREADS = int(os.environ.get("FTIS_TEST_THREADS", "1"))
QUESTION = "Tom has 3 boxes with 12 pencils each. He gives away 9 pencils. How many are left?"


# ---------------------------------------------------------------------------- fast: the sampler

def _torch_reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Independent truncation in torch (full sort), the way HF's logits processors do it."""
    z = torch.tensor(logits, dtype=torch.float64) / temperature
    if top_k:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, -float("inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(z, descending=True, dim=-1)
        p = torch.softmax(srt, -1)
        drop = (p.cumsum(-1) - p) >= top_p
        drop[..., 0] = False
        z = z.scatter(-1, idx, srt.masked_fill(drop, -float("inf")))
    return torch.log_softmax(z, -1).numpy()


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 40, 1.0), (0.7, 0, 0.9),
                                   (1.3, 100, 0.95)])
def test_processed_logprobs_match_reference(t, k, p):
    logits = np.random.default_rng(1).normal(size=(3, 5000)).astype(np.float32) * 4
    ours = processed_logprobs(logits, t, k, p)
    ref = _torch_reference(logits, t, k, p)
    assert np.array_equal(np.isfinite(ours), np.isfinite(ref))
    fin = np.isfinite(ref)
    assert np.abs(ours[fin] - ref[fin]).max() < 1e-10
    assert np.allclose(np.exp(ours).sum(1), 1.0)
    if k:
        assert (np.isfinite(ours).sum(1) <= k).all()


def test_sampled_logprob_is_that_of_the_sampled_token():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 1000)) * 3
    for s in (SamplerSettings(), SamplerSettings(temperature=0.7, top_k=20, top_p=0.8)):
        tok, lp = sample_tokens(logits, s, np.random.default_rng(5))
        ref = _torch_reference(logits, s.temperature, s.top_k, s.top_p)
        assert np.allclose(lp, ref[np.arange(4), tok], atol=1e-10)
        assert np.isfinite(lp).all()


def test_sampling_frequencies_follow_the_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(4000):
        tok, _ = sample_tokens(logits, SamplerSettings(), rng)
        counts[tok[0]] += 1
    assert np.abs(counts / 4000 - [0.5, 0.3, 0.15, 0.05]).max() < 0.03
    counts[:] = 0
    for _ in range(2000):   # top_p=0.7 keeps {0.5, 0.3} renormalised to {0.625, 0.375}
        tok, lp = sample_tokens(logits, SamplerSettings(top_p=0.7), rng)
        counts[tok[0]] += 1
        assert np.isclose(np.exp(lp[0]), [0.625, 0.375][tok[0]])
    assert counts[2:].sum() == 0 and abs(counts[0] / 2000 - 0.625) < 0.04


def test_greedy_and_bad_settings():
    logits = np.array([[0.1, 2.0, -1.0]])
    tok, lp = sample_tokens(logits, SamplerSettings(temperature=0.0), np.random.default_rng(0))
    assert tok.tolist() == [1] and lp.tolist() == [0.0]
    for bad in (SamplerSettings(temperature=-1), SamplerSettings(top_k=-2), SamplerSettings(top_p=0.0),
                SamplerSettings(max_new_tokens=0)):
        with pytest.raises(GenerationError):
            check_sampler(bad)


# ---------------------------------------------------------------------------- fast: the shared loop, the registry

def _tiny_hf(batch_size=None):
    """A randomly initialised 2-layer Llama on a 100-word tokenizer; tokens 1..7 end a sequence
    (so that most sequences stop, and finished rows leave the batch, within a few steps)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    from ftis_edge.generate.hf import HFGenerator
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(100)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="w0")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100))
    return HFGenerator(model, tokenizer, device="cpu", eos_token_ids=range(1, 8), batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_shared_loop_records_the_behaviour_logprobs_and_stops(batch_size):
    gen = _tiny_hf(batch_size)
    prompt = [5, 40, 41, 42]
    s = SamplerSettings(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=12, seed=3)
    gen.record_logits = True
    out = gen.generate(prompt, 5, s)
    assert len(out) == 5 == len(gen.last_logits) and gen.stats["n"] == 5
    assert {c.finish_reason for c in out} == {"stop", "length"}       # both stops, rows left the batch
    for c, raw in zip(out, gen.last_logits):
        ref = _torch_reference(raw, s.temperature, s.top_k, s.top_p)
        # the HF backend samples in torch, in float32, on the model's device: exact to float32 rounding
        assert np.abs(np.asarray(c.logprobs) - ref[np.arange(len(c.token_ids)), c.token_ids]).max() < 1e-5
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in range(1, 8) and not set(c.token_ids[:-1]) & set(range(1, 8))
        else:
            assert len(c.token_ids) == 12
        assert c.text == gen.tokenizer.decode([t for t in c.token_ids if not 1 <= t < 8])
    # an independent batched forward gives the same log-probs (the loop's KV-cache bookkeeping is right)
    again = gen.score(prompt, [c.token_ids for c in out], s.temperature, s.top_k, s.top_p)
    assert _mean_abs([c.logprobs for c in out], again) < 1e-5
    gen.record_logits = False
    assert [c.token_ids for c in gen.generate(prompt, 5, s)] == [c.token_ids for c in out]
    forced = gen.generate(prompt, 3, s, ignore_eos=True)
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in forced)


def test_registry_names_every_backend_and_refuses_unknown_ones(tmp_path):
    from ftis_edge.config import ModelSection
    from ftis_edge.generate.loop import SamplingGenerator
    from ftis_edge.generate.registry import BACKENDS, adapter_problem, backend_class
    for name in BACKENDS:
        cls = backend_class(name)
        assert cls.backend == name and issubclass(cls, SamplingGenerator)
        assert all(callable(getattr(cls, m)) for m in ("create", "adapter_problem", "sync_weights", "set_adapter"))
    with pytest.raises(GenerationError, match="unknown backend 'vllm'; choose one of llamacpp, hf"):
        backend_class("vllm")
    assert "no such file" in adapter_problem("llamacpp", tmp_path / "missing.gguf")
    assert "not a peft adapter directory" in adapter_problem("hf", tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    assert adapter_problem("hf", tmp_path) is None
    import dataclasses
    choices = next(f for f in dataclasses.fields(ModelSection) if f.name == "backend").metadata["choices"]
    assert tuple(choices) == ("auto", *BACKENDS)              # the node file accepts exactly these (+ auto)


def _protocol_members(proto) -> tuple[set[str], set[str]]:
    """(attributes, methods) a typing.Protocol lists."""
    attrs = set(proto.__annotations__)
    methods = {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}
    return attrs, methods


def test_every_backend_has_what_the_generator_protocol_lists():
    """base.Generator / GeneratorBackend are what callers use; each registered backend has all of it
    (methods on the class; attributes on the class or assigned by a method of its class chain)."""
    import inspect
    import re

    from ftis_edge.generate.base import Generator, GeneratorBackend
    from ftis_edge.generate.registry import BACKENDS, backend_class
    attrs, methods = _protocol_members(Generator)
    cls_attrs, cls_methods = _protocol_members(GeneratorBackend)
    assert {"generate_many", "set_stop_texts", "sync_weights"} <= methods
    assert {"create", "adapter_problem", "model_problem", "lora_problem", "gpu_problem", "memory"} == cls_methods
    for name in BACKENDS:
        cls = backend_class(name)
        assigned = {m for k in cls.__mro__[:-1]
                    for m in re.findall(r"self\.(\w+)\s*[:=]", inspect.getsource(k))}
        missing = {a for a in attrs if not hasattr(cls, a) and a not in assigned}
        missing |= {m for m in methods | cls_methods if not callable(getattr(cls, m, None))}
        missing |= {a for a in cls_attrs if not hasattr(cls, a)}
        assert not missing, f"{name} lacks {sorted(missing)}"
    assert backend_class("llamacpp").loads_weight_files and not backend_class("hf").loads_weight_files


def test_the_tiny_hf_generator_instance_has_every_protocol_attribute():
    from ftis_edge.generate.base import Generator
    gen = _tiny_hf()
    attrs, _ = _protocol_members(Generator)
    assert all(hasattr(gen, a) for a in attrs), sorted(a for a in attrs if not hasattr(gen, a))


# ---------------------------------------------------------------------------- real models

@pytest.fixture(scope="module")
def bundle():
    from ftis_edge.models.resolve import resolve_model
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompt(bundle):
    return bundle.encode(bundle.render_prompt([{"role": "user", "content": QUESTION}]))


@pytest.fixture(scope="module")
def llama_q(bundle):
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    g = LlamaCppGenerator.from_bundle(bundle, "quantized", n_ctx=512, max_group=8, n_threads=THREADS)
    yield g
    g.close()


@pytest.fixture(scope="module")
def llama_f16(bundle):
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    g = LlamaCppGenerator.from_bundle(bundle, "f16", n_ctx=512, max_group=8, n_threads=THREADS)
    yield g
    g.close()


@pytest.fixture(scope="module")
def hf(bundle):
    torch.set_num_threads(max(THREADS, 1))
    from ftis_edge.generate.hf import HFGenerator
    g = HFGenerator.from_bundle(bundle, device="cpu", n_ctx=512)
    yield g
    g.close()


@pytest.fixture(scope="module")
def group_q(llama_q, prompt):
    """4 completions sampled at T=1 by the quantized engine; the sequences every engine scores."""
    return llama_q.generate(prompt, 4, SamplerSettings(temperature=1.0, max_new_tokens=48, seed=11))


def _mean_abs(a_list, b_list):
    return float(np.mean(np.concatenate([np.abs(np.asarray(a) - np.asarray(b)) for a, b in zip(a_list, b_list)])))


@pytest.mark.model
def test_group_shape_eos_convention(group_q, bundle, llama_q):
    assert len(group_q) == 4
    for c in group_q:
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert all(lp <= 0 and np.isfinite(lp) for lp in c.logprobs)
        assert c.sampler == SamplerSettings(temperature=1.0, max_new_tokens=48, seed=11).as_dict()
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in bundle.eos_token_ids          # the stop token is kept ...
            assert not any(t in bundle.eos_token_ids for t in c.token_ids[:-1])
            assert "<|im_end|>" not in c.text                        # ... but not in the text
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == 48
        body = [t for t in c.token_ids if t not in bundle.eos_token_ids]
        assert c.text == llama_q.detokenize(body, special=True)
    assert llama_q.tok_s > 0 and llama_q.stats["tokens"] == sum(len(c.token_ids) for c in group_q)


@pytest.mark.model
def test_quantized_vs_pytorch_and_f16_vs_pytorch(group_q, prompt, llama_q, llama_f16, hf):
    """Same sequences scored by three engines (docs/bridge.md, the log-prob contract): Q4_1 ~0.05 nats/token, F16 ~0.002."""
    seqs = [c.token_ids for c in group_q]
    ref = hf.score(prompt, seqs)
    gen_time = [c.logprobs for c in group_q]          # T=1, no truncation: raw log-softmax
    assert _mean_abs(gen_time, ref) < 0.1
    assert _mean_abs(llama_q.score(prompt, seqs), ref) < 0.1
    f16 = _mean_abs(llama_f16.score(prompt, seqs), ref)
    assert f16 < 0.01
    assert f16 < _mean_abs(llama_q.score(prompt, seqs), ref)


@pytest.mark.model
@pytest.mark.parametrize("backend", ["llama_f16", "hf"])
def test_logprobs_are_those_of_the_processed_distribution(backend, request, prompt):
    gen = request.getfixturevalue(backend)
    for s in (SamplerSettings(temperature=0.7, max_new_tokens=24, seed=3),
              SamplerSettings(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=24, seed=4)):
        gen.record_logits = True
        try:
            out = gen.generate(prompt, 3, s)
        finally:
            gen.record_logits = False
        for c, raw in zip(out, gen.last_logits):
            ref = _torch_reference(raw, s.temperature, s.top_k, s.top_p)
            expect = ref[np.arange(len(c.token_ids)), c.token_ids]
            assert np.isfinite(expect).all()                    # never sampled a truncated token
            # llama.cpp: the numpy sampler (float64); HF: the torch sampler on the device (float32)
            assert np.abs(np.asarray(c.logprobs) - expect).max() < (1e-6 if backend == "llama_f16" else 1e-5)
            raw_lsm = torch.log_softmax(torch.tensor(raw, dtype=torch.float64), -1).numpy()
            raw_lp = raw_lsm[np.arange(len(c.token_ids)), c.token_ids]
            assert not np.allclose(raw_lp, c.logprobs, atol=1e-3)   # temperature really applied
        if s.top_k == 0:
            # an independent forward of the same engine agrees (F16 llama.cpp: decode vs prefill)
            again = gen.score(prompt, [c.token_ids for c in out], temperature=0.7)
            assert _mean_abs([c.logprobs for c in out], again) < 0.01


@pytest.mark.model
@pytest.mark.parametrize("backend", ["llama_q", "hf"])
def test_seeding(backend, request, prompt):
    gen = request.getfixturevalue(backend)
    s = SamplerSettings(temperature=1.0, max_new_tokens=16, seed=123)
    a = gen.generate(prompt, 3, s)
    b = gen.generate(prompt, 3, s)
    c = gen.generate(prompt, 3, SamplerSettings(temperature=1.0, max_new_tokens=16, seed=124))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.logprobs for x in a] == [x.logprobs for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert len({tuple(x.token_ids) for x in a}) > 1            # the group members differ


@pytest.mark.model
@pytest.mark.parametrize("backend", ["llama_q", "hf"])
def test_context_overflow_and_bad_ids(backend, request, prompt):
    gen = request.getfixturevalue(backend)
    with pytest.raises(GenerationError, match="exceeds the context"):
        gen.generate(prompt * 12, 2, SamplerSettings(max_new_tokens=64))
    with pytest.raises(GenerationError, match="outside"):
        gen.generate([1, 2, 10**7], 2, SamplerSettings(max_new_tokens=4))
    with pytest.raises(GenerationError, match="empty"):
        gen.generate([], 2, SamplerSettings(max_new_tokens=4))


@pytest.mark.model
def test_group_larger_than_max_group_and_forced_length(llama_q, prompt):
    out = llama_q.generate(prompt, 10, SamplerSettings(max_new_tokens=6, seed=2), ignore_eos=True)
    assert len(out) == 10 and all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in out)


@pytest.mark.model
def test_hf_restores_train_mode_and_records_adapter_version(hf, prompt):
    hf.model.train()
    hf.generate(prompt, 2, SamplerSettings(max_new_tokens=4))
    assert hf.model.training
    hf.model.eval()
    hf.set_adapter("/some/adapter.gguf", 7)
    assert hf.adapter_version == 7


def _write_random_lora(path, bundle, rank=4, alpha=8.0, seed=0):
    """A GGUF LoRA adapter on attn_q / attn_v with random A, B (test fixture only)."""
    import gguf
    rng = np.random.default_rng(seed)
    hidden = 576
    w = gguf.GGUFWriter(str(path), bundle.arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    out_dims = {"attn_q": bundle.n_head * 64, "attn_v": bundle.n_head_kv * 64}
    for layer in range(bundle.n_layer):
        for name, out_dim in out_dims.items():
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_a",
                         (rng.normal(size=(rank, hidden)) * 0.05).astype(np.float32))
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_b",
                         (rng.normal(size=(out_dim, rank)) * 0.05).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.model
def test_adapter_hot_swap_and_reload(llama_f16, bundle, prompt, group_q, tmp_path):
    seqs = [c.token_ids for c in group_q[:2]]
    base = llama_f16.score(prompt, seqs)
    adapter = tmp_path / "lora.gguf"
    _write_random_lora(adapter, bundle)
    llama_f16.set_adapter(adapter, version=1)
    assert llama_f16.adapter_version == 1
    with_lora = llama_f16.score(prompt, seqs)
    assert _mean_abs(base, with_lora) > 0.05                       # the adapter is active
    out = llama_f16.generate(prompt, 2, SamplerSettings(max_new_tokens=8, seed=1))
    assert all(len(c.token_ids) >= 1 for c in out)
    llama_f16.set_adapter(adapter, version=2, scale=0.0)
    assert _mean_abs(base, llama_f16.score(prompt, seqs)) < 1e-5    # scale 0 = base
    llama_f16.set_adapter(None, version=3)
    assert _mean_abs(base, llama_f16.score(prompt, seqs)) < 1e-5    # removed: base again
    with pytest.raises(GenerationError, match="not found"):
        llama_f16.set_adapter(tmp_path / "missing.gguf", version=4)
    # reload swaps the base weights file: quantized scores differ from F16 ones, then back
    llama_f16.reload(bundle.gguf_path, version=5)
    assert _mean_abs(base, llama_f16.score(prompt, seqs)) > 0.01
    llama_f16.reload(bundle.f16_gguf(), version=6)
    assert _mean_abs(base, llama_f16.score(prompt, seqs)) < 1e-5


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_gemma3_both_backends_agree():
    """A second architecture and tokenizer (262k vocab, <bos>, plain prompt format, sliding window)."""
    from ftis_edge.generate.hf import HFGenerator
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.models.resolve import resolve_model
    gemma = resolve_model("gemma3-270m")
    ids = gemma.encode(gemma.render_prompt([{"role": "user", "content": QUESTION}]))
    assert ids[0] == 2
    llama = LlamaCppGenerator.from_bundle(gemma, "f16", n_ctx=256, max_group=4, n_threads=THREADS)
    hf = HFGenerator.from_bundle(gemma, device="cpu", n_ctx=256)
    try:
        s = SamplerSettings(temperature=0.8, max_new_tokens=16, seed=5)
        out = llama.generate(ids, 2, s)
        assert all(np.isfinite(c.logprobs).all() and c.text for c in out)
        ref = hf.score(ids, [c.token_ids for c in out], temperature=0.8)
        assert _mean_abs([c.logprobs for c in out], ref) < 0.01       # F16 llama.cpp == PyTorch
        a = hf.generate(ids, 2, s)
        assert [c.token_ids for c in a] == [c.token_ids for c in hf.generate(ids, 2, s)]
        again = hf.score(ids, [c.token_ids for c in a], temperature=0.8)
        assert _mean_abs([c.logprobs for c in a], again) < 1e-3
    finally:
        llama.close()
        hf.close()


# ---------------------------------------------------------------------------- many prompts, sized context

@pytest.mark.parametrize("prompts", [
    [[5, 40, 41, 42], [5, 40, 41, 43, 44], [5, 40, 9]],       # a shared prefix: padded batches (hf_batch)
    [[5, 40, 41, 42], [5, 40, 41, 43, 44], [9]]])             # none: one prompt at a time
def test_hf_generate_many_gives_the_completions_of_one_prompt_at_a_time(prompts):
    gen = _tiny_hf()
    gen._batch_rows = 4                                         # batches of 2 prompts x 2: one of 2, one of 1
    samplers = [SamplerSettings(temperature=1.0, max_new_tokens=8, seed=i) for i in range(3)]
    done = []
    many = gen.generate_many(prompts, 2, samplers, on_done=lambda i, c: done.append(i))
    assert done == [0, 1, 2] and gen.stats["n"] == 6
    alone = [gen.generate(p, 2, s) for p, s in zip(prompts, samplers)]
    assert [[c.token_ids for c in g] for g in many] == [[c.token_ids for c in g] for g in alone]
    _sampled_with_their_logits(gen, prompts, 2, samplers)      # each token's log-prob is its distribution's
    with pytest.raises(GenerationError, match="3 prompts but 2 sampler settings"):
        gen.generate_many(prompts, 1, samplers[:2])
    with pytest.raises(GenerationError, match="no prompts to generate for"):
        gen.generate_many([], 1, [])
    with pytest.raises(GenerationError, match="prompt 2 of 3: prompt_ids is empty"):
        gen.generate_many([prompts[0], [], prompts[2]], 1, samplers)


def _sampled_with_their_logits(g, prompts, n: int, samplers) -> list:
    """``n`` sampled completions per prompt, checked: the recorded log-prob of every token is that
    of the processed distribution (temperature, top-p) of the logits it was drawn from."""
    g.record_logits = True
    many = g.generate_many(prompts, n, samplers)
    g.record_logits = False
    comps = [c for grp in many for c in grp]
    assert [len(grp) for grp in many] == [n] * len(prompts) and len(g.last_logits) == len(comps)
    for c, s, raw in zip(comps, [s for s in samplers for _ in range(n)], g.last_logits):
        assert len(raw) == len(c.token_ids)
        ref = _torch_reference(raw, s.temperature, 0, s.top_p)
        assert np.abs(np.asarray(c.logprobs) - ref[np.arange(len(c.token_ids)), c.token_ids]).max() < 1e-6
    return comps


def _arith_prompts(bundle, n):
    from ftis_edge.tasks import get_task
    task = get_task("arith")
    return [bundle.encode(bundle.render_prompt(task.messages(p.question))) for p in task.eval_prompts(n)]


@pytest.mark.model
def test_llamacpp_decodes_many_prompts_together_with_the_same_greedy_answers(bundle):
    """Several prompts in one batch (their few-shot prefix decoded once, sequence ids per prompt)
    give token for token the greedy completions of one prompt at a time."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.generate.loop import _common_prefix
    prompts = _arith_prompts(bundle, 6)
    assert _common_prefix(prompts) > 100                 # system text + few-shot examples
    g = LlamaCppGenerator.from_bundle(bundle, "f16", max_group=8, n_threads=THREADS)
    try:
        samplers = [SamplerSettings(temperature=0.0, max_new_tokens=40, seed=i) for i in range(6)]
        many = g.generate_many(prompts, 1, samplers)
        assert g.stats["n"] == 6
        alone = [g.generate(p, 1, s) for p, s in zip(prompts, samplers)]
        assert [c.token_ids for grp in many for c in grp] == [c.token_ids for grp in alone for c in grp]
        assert len({tuple(grp[0].token_ids) for grp in many}) > 1      # different prompts, different answers
        # sampled, 2 per prompt: the recorded log-prob of every token is that of the processed
        # distribution of the logits it was drawn from (F16 batch-shape rounding moves logits by
        # ~1e-3, so sampled tokens may differ from one-prompt-at-a-time runs; greedy ones do not)
        s2 = [SamplerSettings(temperature=0.8, top_p=0.95, max_new_tokens=12, seed=10 + i) for i in range(3)]
        _sampled_with_their_logits(g, prompts[:3], 2, s2)
    finally:
        g.close()


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_hf_decodes_many_prompts_together_with_the_same_greedy_answers(bundle, hf):
    """The HF backend's padded batches (the few-shot prefix decoded once, tails left-padded and
    masked) give token for token the greedy completions of one prompt at a time: 5 prompts in
    batches of 4 and 1, answers of different lengths leaving the batch as they end."""
    from ftis_edge.generate.loop import _common_prefix
    prompts = _arith_prompts(bundle, 5)
    assert _common_prefix(prompts) > 100 and len({len(p) for p in prompts}) > 1
    hf._batch_rows = 4
    try:
        samplers = [SamplerSettings(temperature=0.0, max_new_tokens=32, seed=i) for i in range(5)]
        many = hf.generate_many(prompts, 1, samplers)
        alone = [hf.generate(p, 1, s) for p, s in zip(prompts, samplers)]
    finally:
        hf._batch_rows = 32
    assert [c.token_ids for grp in many for c in grp] == [c.token_ids for grp in alone for c in grp]
    assert len({len(grp[0].token_ids) for grp in many}) > 1           # rows left the batch at different steps
    assert len({tuple(grp[0].token_ids) for grp in many}) > 1


@pytest.mark.model
def test_hf_generate_many_refuses_bad_input_clearly(bundle, hf, prompt):
    s = SamplerSettings(temperature=0.0, max_new_tokens=32)
    with pytest.raises(GenerationError, match="no prompts to generate for"):
        hf.generate_many([], 1, [])
    too_long = prompt + [prompt[-1]] * (hf.n_ctx - len(prompt))           # n_ctx tokens: no room to answer
    with pytest.raises(GenerationError, match=r"prompt 2 of 2: prompt \(512 tokens\) \+ max_new_tokens \(32\) = "
                                              r"544 exceeds the context \(512 tokens\)"):
        hf.generate_many([prompt, too_long], 1, [s, s])


@pytest.mark.model
def test_llamacpp_refills_finished_slots_with_the_next_prompt(bundle):
    """Continuous batching: 9 prompts through 3 slots, answers of very different lengths (each
    prompt its own max_new_tokens), so slots are freed and refilled mid-way — still token for
    token the greedy answers of one prompt at a time, reported once per prompt; and with 2
    sequences per prompt in a pool of 5 (one slot always spare), every group complete."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    prompts = _arith_prompts(bundle, 9)
    g = LlamaCppGenerator.from_bundle(bundle, "f16", max_group=3, n_threads=THREADS)
    try:
        samplers = [SamplerSettings(temperature=0.0, max_new_tokens=4 + 7 * (i % 4), seed=i) for i in range(9)]
        done = []
        many = g.generate_many(prompts, 1, samplers, on_done=lambda i, c: done.append((i, len(c))))
        assert g.stats["n"] == 9 and g.stats["tokens"] == sum(len(c.token_ids) for grp in many for c in grp)
        alone = [g.generate(p, 1, s) for p, s in zip(prompts, samplers)]
        assert [c.token_ids for grp in many for c in grp] == [c.token_ids for grp in alone for c in grp]
        assert sorted(done) == [(i, 1) for i in range(9)] and [i for i, _ in done] != list(range(9))
    finally:
        g.close()
    g = LlamaCppGenerator.from_bundle(bundle, "f16", max_group=5, n_threads=THREADS)
    try:
        s2 = [SamplerSettings(temperature=0.9, max_new_tokens=6 + 5 * i, seed=20 + i) for i in range(4)]
        comps = _sampled_with_their_logits(g, prompts[:4], 2, s2)
        for c, s in zip(comps, [s for s in s2 for _ in range(2)]):
            assert 1 <= len(c.token_ids) <= s.max_new_tokens
    finally:
        g.close()


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_llamacpp_pool_stores_the_shared_prefix_once_and_uses_only_the_slots_it_holds(bundle):
    """n_shared: the cache holds the prompts' common prefix once + each slot's tail and completion
    (fewer cells than n_ctx per slot), and still the same greedy answers as one prompt at a time; a
    full group of the longest prompt still fits (the training path). A cache sized for a longer
    prefix than the prompts share runs fewer slots (never out of cells), with the same answers."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    from ftis_edge.generate.loop import shared_prefix_len
    prompts = _arith_prompts(bundle, 6)
    shared, longest = shared_prefix_len(prompts), max(map(len, prompts))
    n_ctx, per_slot = longest + 40, longest - shared + 40
    samplers = [SamplerSettings(temperature=0.0, max_new_tokens=40, seed=i) for i in range(6)]
    g = LlamaCppGenerator.from_bundle(bundle, "f16", n_ctx=n_ctx, max_group=6, n_shared=shared, n_threads=THREADS)
    try:
        need = shared + 6 * per_slot
        assert g.n_cells == -(-need // 256) * 256 < 6 * n_ctx         # llama.cpp rounds up to 256
        assert g._pool_slots(1, shared, per_slot) == 6
        many = g.generate_many(prompts, 1, samplers)
        alone = [g.generate(p, 1, s) for p, s in zip(prompts, samplers)]
        assert [c.token_ids for grp in many for c in grp] == [c.token_ids for grp in alone for c in grp]
        group = g.generate(max(prompts, key=len), 6, SamplerSettings(max_new_tokens=40, seed=3), ignore_eos=True)
        assert [len(c.token_ids) for c in group] == [40] * 6
    finally:
        g.close()
    # sized for a prefix of n_ctx - 41 tokens: (512 - shared) // per_slot slots hold for sure
    g = LlamaCppGenerator.from_bundle(bundle, "f16", n_ctx=n_ctx, max_group=6, n_shared=n_ctx - 41,
                                      n_threads=THREADS)
    try:
        fit = (g.n_cells - shared) // per_slot
        assert 2 <= fit < 6 and g._pool_slots(1, shared, per_slot) == fit
        used = set()
        step = g._pool_step
        def recording(feeds, entering):
            used.update(s for s, _, _ in feeds)
            used.update(s for _, _, slots in entering for s in slots)
            return step(feeds, entering)
        g._pool_step = recording
        many = g.generate_many(prompts, 1, samplers)
        assert used == set(range(fit))
        assert [c.token_ids for grp in many for c in grp] == [c.token_ids for grp in alone for c in grp]
    finally:
        g.close()


@pytest.mark.model
def test_llamacpp_full_cache_is_a_clear_error_not_an_abort(bundle, prompt):
    """More tokens than free cells: a GenerationError that says so (llama_decode returns 1), and the
    generator goes on working; batches are cut to what the context accepts (llama.cpp caps n_batch
    at a small context's n_ctx and aborts the process on a larger batch)."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    g = LlamaCppGenerator.from_bundle(bundle, "f16", n_ctx=64, max_group=2, n_threads=THREADS)
    try:
        assert g.n_cells == 256
        g._pool_start(list(range(1000, 1200)))            # 200 tokens: two decodes of <= 128
        with pytest.raises(GenerationError, match="no KV slot for 120 token.*256 cells"):
            g._pool_step([], [(list(range(2000, 2060)), 200, [0]), (list(range(3000, 3060)), 200, [1])])
        out = g.generate(prompt[:24], 2, SamplerSettings(max_new_tokens=8, seed=1), ignore_eos=True)
        assert [len(c.token_ids) for c in out] == [8, 8]
    finally:
        g.close()


@pytest.mark.model
def test_llamacpp_context_follows_the_task_and_grows_when_needed(bundle, prompt, capfd):
    from ftis_edge.generate.llamacpp import GROWABLE_START, LlamaCppGenerator
    g = LlamaCppGenerator.from_bundle(bundle, "f16", max_group=8, n_threads=THREADS)
    try:
        err = capfd.readouterr().err
        assert "n_ctx_train" not in err and "overflow" not in err      # 8 x 512 cells <= 8192 trained
        assert g.n_ctx == GROWABLE_START
        long_prompt = (prompt * 20)[:600]
        out = g.generate(long_prompt, 2, SamplerSettings(max_new_tokens=8, seed=1), ignore_eos=True)
        assert g.n_ctx >= 608 and all(len(c.token_ids) == 8 for c in out)
    finally:
        g.close()
    fixed = LlamaCppGenerator.from_bundle(bundle, "f16", n_ctx=256, max_group=2, n_threads=THREADS)
    try:
        with pytest.raises(GenerationError, match="exceeds the context"):
            fixed.generate(prompt * 12, 1, SamplerSettings(max_new_tokens=64))
    finally:
        fixed.close()


# ---------------------------------------------------------------------------- stop texts (plain format)

@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
def test_gemma3_stops_at_its_next_plain_format_turn():
    """Gemma 3 270M has no chat template: prompted as ``User: … Assistant:`` it answers and then
    writes the next ``User:`` turn itself. The generator stops there: the completion is the
    unstopped one cut at the token that finishes the marker (tokens and log-probs unchanged),
    and the reward rule reads the answer in front of the marker."""
    from ftis_edge.generate.registry import create_generator
    from ftis_edge.generate.base import GeneratorOptions
    from ftis_edge.models.resolve import PLAIN_TURN_STOP, resolve_model
    from ftis_edge.tasks import get_task
    from ftis_edge.tasks.rewards import check_format
    gemma = resolve_model("gemma3-270m")
    assert gemma.stop_texts == (PLAIN_TURN_STOP,)
    assert resolve_model("smollm2-135m").stop_texts == ()      # a chat template ends turns with EOS
    task = get_task("arith", level=[1, 2])
    prompts = [p for _, p in zip(range(3), task.prompts(seed=1))]
    ids = [gemma.encode(gemma.render_prompt(task.messages(p.question))) for p in prompts]
    gen = create_generator("llamacpp", gemma, GeneratorOptions(precision="f16", threads=THREADS, max_group=4))
    try:
        assert gen.stop_texts == (PLAIN_TURN_STOP,)
        settings = [SamplerSettings(temperature=1.0, max_new_tokens=48, seed=s) for s in range(3)]
        stopped = [gen.generate(i, 1, s)[0] for i, s in zip(ids, settings)]
        pooled = gen.generate_many(ids, 1, settings)                  # the continuous-batching path
        gen.set_stop_texts(())
        free = [gen.generate(i, 1, s)[0] for i, s in zip(ids, settings)]
    finally:
        gen.close()
    hits = 0
    for a, b, pool in zip(stopped, free, pooled):
        assert pool[0].token_ids == a.token_ids
        k = len(a.token_ids)
        assert a.token_ids == b.token_ids[:k] and a.logprobs == b.logprobs[:k]
        if PLAIN_TURN_STOP in b.text:
            hits += 1
            assert a.finish_reason == "stop" and a.text.endswith(PLAIN_TURN_STOP)
            assert a.text.count(PLAIN_TURN_STOP) == 1 and k < len(b.token_ids)
            body = a.text[:-len(PLAIN_TURN_STOP)]
            if check_format(body).ok:
                assert check_format(a.text).ok                       # the marker is not "text after"
        else:
            assert a.token_ids == b.token_ids
    assert hits >= 1, [b.text for b in free]
