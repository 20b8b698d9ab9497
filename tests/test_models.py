"""Model specs, fingerprints, conversion cache, tokenizer parity llama.cpp <-> transformers."""
from __future__ import annotations

import hashlib
import os
import time

import pytest

from ftis_edge.models.resolve import ModelError, resolve_model, tokenizer_fingerprint_of

THREADS = int(os.environ.get("FTIS_TEST_THREADS", "1"))

PARITY_STRINGS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "1234567890 + 3.14159 = 1.5e10; -42 * 7 = -294",
    "Café, naïve, façade, Ærøskøbing, Straße",
    "数学是科学的语言。日本語のテキスト。한국어",
    "Emoji: 🤖🚀👍🏽 and ❤️",
    "def f(x):\n\tif x  >  0:\n\t\treturn x ** 2\r\n    else:   return None",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<bos>text",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. #### 72",
    "   leading spaces and trailing   ",
    "x  >  0, a   123456 b,  12  , 1,000,000 and  7\n 8",
]


# ---------------------------------------------------------------------------- fast: errors

def _assert_fast_model_error(spec, *needles, limit=10.0):
    t0 = time.monotonic()
    with pytest.raises(ModelError) as info:
        resolve_model(spec)
    assert time.monotonic() - t0 < limit
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_unknown_alias_is_a_clear_error():
    _assert_fast_model_error("smollm9-1b", "unknown spec", "smollm2-135m")


def test_missing_gguf_file(tmp_path):
    _assert_fast_model_error(str(tmp_path / "nope.gguf"), "file not found")


def test_missing_path(tmp_path):
    _assert_fast_model_error(str(tmp_path / "no" / "such" / "model"), "no such file")


def test_non_gguf_file(tmp_path):
    for name in ("fake.gguf", "weights.bin"):
        path = tmp_path / name
        path.write_bytes(b"PK\x03\x04 definitely not gguf" * 10)
        _assert_fast_model_error(str(path), "not a GGUF file")


def test_directory_without_config(tmp_path):
    _assert_fast_model_error(str(tmp_path), "no config.json")


def test_hub_id_offline_is_fast_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _assert_fast_model_error("ftis-edge-tests/no-such-model", "not in the local HF cache", "unreachable")


def test_hub_id_without_network_env_is_fast(tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE: the connectivity probe decides (here: no network -> clear error)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    # with network (CI) the hub answers "repository not found": still one ModelError line
    _assert_fast_model_error("ftis-edge-tests/no-such-model", "ftis-edge-tests/no-such-model", limit=30.0)


# ---------------------------------------------------------------------------- real models

@pytest.fixture(scope="module")
def smol():
    bundle = resolve_model("smollm2-135m")
    bundle.arch            # parse the GGUF once (2 s on a cold cache); later resolves hit the index
    return bundle


@pytest.fixture(scope="module")
def gemma():
    return resolve_model("gemma3-270m")


@pytest.mark.model
def test_default_alias_metadata_and_speed(smol):
    t0 = time.monotonic()
    b = resolve_model(None)
    assert b.arch == "llama"            # metadata read inside the timing: comes from the cache
    assert time.monotonic() - t0 < 10.0  # a hang guard: nothing is converted (~20 s) or downloaded
    assert b.spec == "smollm2-135m"
    assert (b.n_layer, b.n_head, b.n_head_kv, b.vocab_size) == (30, 9, 3, 49152)
    assert b.eos_token_ids[0] == 2      # <|im_end|>
    assert b.gguf_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.model
def test_gemma_alias_metadata(gemma):
    assert gemma.arch == "gemma3"
    assert (gemma.n_layer, gemma.n_head, gemma.n_head_kv, gemma.vocab_size) == (18, 4, 1, 262144)
    assert gemma.eos_token_ids[:2] == [1, 106]          # <eos>, <end_of_turn>
    assert gemma.gguf_path.stat().st_size > 200e6


@pytest.mark.model
def test_fingerprints_stable_and_real(smol):
    h = hashlib.sha256(smol.gguf_path.read_bytes()).hexdigest()[:16]
    assert smol.fingerprint == h == resolve_model("smollm2-135m").fingerprint
    assert len(smol.tokenizer_fingerprint) == 16
    assert smol.tokenizer_fingerprint == resolve_model(str(smol.gguf_path)).tokenizer_fingerprint


@pytest.mark.model
@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_tokenizer_fingerprint_same_from_gguf_and_hf(name, request):
    bundle = request.getfixturevalue(name)
    assert tokenizer_fingerprint_of(bundle.tokenizer()) == bundle.tokenizer_fingerprint


@pytest.mark.model
def test_tokenizer_fingerprints_differ_between_models(smol, gemma):
    assert smol.tokenizer_fingerprint != gemma.tokenizer_fingerprint
    assert smol.fingerprint != gemma.fingerprint


@pytest.mark.model
def test_conversion_cache(smol):
    first = smol.hf_dir()                       # converts on a fresh cache (~20 s), else cached
    written = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    again = resolve_model("smollm2-135m").hf_dir()
    assert again == first and {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == written   # not converted again
    assert (first / "config.json").is_file() and list(first.glob("*.safetensors"))
    assert (first / "tokenizer_config.json").is_file()
    f16 = smol.f16_gguf()
    assert f16 == smol.generator_gguf("f16") and f16.read_bytes()[:4] == b"GGUF"
    assert smol.generator_gguf("quantized") == smol.gguf_path
    with pytest.raises(ModelError, match="precision"):
        smol.generator_gguf("int3")


@pytest.mark.model
def test_hf_dir_spec(smol):
    hf = resolve_model(str(smol.hf_dir()))
    assert hf.gguf_path is None and hf.arch == "llama"
    assert (hf.n_layer, hf.n_head, hf.n_head_kv, hf.vocab_size) == (30, 9, 3, 49152)
    assert hf.fingerprint == resolve_model(str(smol.hf_dir())).fingerprint
    assert hf.tokenizer_fingerprint == smol.tokenizer_fingerprint     # same vocab, other source
    assert 2 in hf.eos_token_ids
    # llamacpp backend on an HF model: converted once by llama.cpp's converter, cached by the weights' hash
    f16 = hf.f16_gguf()
    assert f16.name == f"{hf.fingerprint}.hf.f16.gguf" and hf.base_gguf() == f16
    assert resolve_model(str(f16)).arch == "llama" and resolve_model(str(f16)).vocab_size == 49152
    t0 = time.time()
    assert resolve_model(str(smol.hf_dir())).generator_gguf("f16") == f16 and time.time() - t0 < 5


@pytest.mark.model
def test_render_prompt(smol, gemma):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    text = smol.render_prompt(msgs)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert gemma.render_prompt(msgs) == "System: Be brief.\n\nUser: What is 2+2?\n\nAssistant:"
    with pytest.raises(ModelError, match="role"):
        smol.render_prompt([{"content": "x"}])


@pytest.mark.model
@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_tokenizer_parity_with_llamacpp(name, request):
    """bundle.encode (transformers) == llama.cpp's own tokenizer, BOS handling included."""
    from ftis_edge.generate.llamacpp import LlamaCppGenerator
    bundle = request.getfixturevalue(name)
    gen = LlamaCppGenerator(bundle.gguf_path, n_ctx=64, max_group=1, n_batch=64, n_threads=THREADS)
    try:
        add_bos = name == "gemma"       # GGUF metadata: SmolLM2 no BOS, Gemma 3 prepends <bos>=2
        for s in PARITY_STRINGS:
            ours = bundle.encode(s)
            assert ours == gen.tokenize(s, add_bos=add_bos, special=True), s
            body = ours[1:] if add_bos else ours
            assert gen.detokenize(body, special=True) == bundle.tokenizer().decode(body), s
        assert (bundle.encode("Hi")[0] == 2) == add_bos
    finally:
        gen.close()
