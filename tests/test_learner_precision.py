"""Learner(precision=...): bf16 autocast on the CPU only when asked; fp32 stays exact.

Fast: a tiny random-weight llama saved to a temp dir and loaded by the real ``Learner``.
"""
import random

import pytest
import torch

from ftis_edge.learn.learner import Learner, LearnerError, TrainSample

VOCAB = 101


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _samples():
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(9)]
    out = []
    for n in (4, 7, 12):
        out.append(TrainSample(prompt, [rng.randrange(VOCAB) for _ in range(n)], [-1.0] * n, None, 1.0))
    return out


def test_bf16_on_the_cpu_autocasts_and_stays_close_to_fp32(tiny_dir):
    samples = _samples()
    logp = {}
    for precision in ("auto", "fp32", "bf16"):
        learner = Learner(tiny_dir, trainable="lora", device="cpu", precision=precision)
        assert (learner.autocast_dtype is torch.bfloat16) == (precision == "bf16")
        with torch.no_grad():
            lp, mask = learner.logprobs(samples)
        logp[precision] = lp[mask]
        stats = learner.step(samples, method="f-tis")     # a bf16 step trains too
        assert stats["skipped"] == 0 and torch.isfinite(torch.tensor(stats["loss"]))
    assert torch.equal(logp["auto"], logp["fp32"])          # the CPU default is unchanged
    diff = (logp["bf16"] - logp["fp32"]).abs()
    assert 0 < float(diff.max()) < 0.1


def test_an_unknown_precision_is_refused(tiny_dir):
    with pytest.raises(LearnerError, match="precision"):
        Learner(tiny_dir, trainable="lora", device="cpu", precision="fp16")


def test_the_setting_and_the_cpu_check(tmp_path, monkeypatch):
    from ftis_edge.run import machine
    from ftis_edge.config import ConfigError, load as load_config
    good = tmp_path / "good.toml"
    good.write_text('[train]\nprecision = "bf16"\n')
    assert load_config(good).train.precision == "bf16"
    bad = tmp_path / "bad.toml"
    bad.write_text('[train]\nprecision = "fp16"\n')
    with pytest.raises(ConfigError, match="precision"):
        load_config(bad)
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(machine, "CPUINFO", info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert machine.cpu_has_bf16() is False
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert machine.cpu_has_bf16() is True
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "missing")
    assert machine.cpu_has_bf16() is None
