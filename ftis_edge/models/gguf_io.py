"""Every GGUF byte ftis-edge reads or writes, through llama.cpp's own ``gguf`` package.

Reading: ``check_gguf_file`` (magic bytes), ``read_gguf_metadata`` (what ``models`` indexes).
Writing (always to a temp file renamed into place, so a reader never sees half a file):

* ``export_f16_gguf``: the dequantized tensors of a GGUF as F16 (2-D) / F32 (1-D), same metadata;
* ``write_gguf_lora``: a peft LoRA as a GGUF LoRA adapter (~2 MB, ~10 ms) for llama.cpp's hot swap;
* ``export_merged_gguf``: a model's current weights (LoRA merged in) under a base GGUF's metadata.

The PyTorch <-> GGUF tensor layout differs per architecture in the ways ``ARCH_LAYOUTS`` lists
(what llama.cpp's converter does and transformers' GGUF loader undoes); ``models`` and ``sync``
both use this module, so the layout rules live here once.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common import atomic
from ..errors import FtisError
from ..common.turns import END_OF_TURN_TEXTS

GGUF_MAGIC = b"GGUF"


class GGUFError(FtisError, ValueError):
    """A GGUF cannot be read, or a model cannot be written as one; the message is one readable line."""


# --------------------------------------------------------------------------- architecture layouts

@dataclass(frozen=True)
class ArchLayout:
    """How one architecture's PyTorch tensors differ from the GGUF that llama.cpp's converter writes.

    Checked against each converter class of llama.cpp (conversion/*.py, ``modify_tensors``) and
    verified end to end per architecture by tests/test_arch_matrix.py.
    """
    hf_model_types: tuple        # transformers ``model_type`` values served by this GGUF architecture
    permute_qk: bool = False     # q/k rows permuted into llama.cpp's rotary layout (LlamaModel.permute)
    norm_offset: float = 0.0     # added to every *norm.weight (Gemma's RMSNorm multiplies by 1 + w)
    examples: str = ""           # model families people run (docs, error messages)


ARCH_LAYOUTS = {
    "llama": ArchLayout(("llama", "mistral"), permute_qk=True,
                        examples="Llama 3.x, SmolLM2, Mistral 7B"),
    "qwen2": ArchLayout(("qwen2",), examples="Qwen2.5"),
    "qwen3": ArchLayout(("qwen3",), examples="Qwen3 (dense)"),
    "gemma3": ArchLayout(("gemma3_text", "gemma3"), norm_offset=1.0, examples="Gemma 3 (text)"),
    "phi3": ArchLayout(("phi3",), examples="Phi-3, Phi-3.5, Phi-4-mini"),
}
SUPPORTED = ", ".join(f"{arch} ({layout.examples})" for arch, layout in ARCH_LAYOUTS.items())


def gguf_arch_of(hf_model_type: str | None) -> str | None:
    """The llama.cpp architecture name for a transformers ``model_type`` (None if unsupported)."""
    return next((a for a, lay in ARCH_LAYOUTS.items() if hf_model_type in lay.hf_model_types), None)


def arch_layout(arch: str) -> ArchLayout:
    layout = ARCH_LAYOUTS.get(arch)
    if layout is None:
        raise GGUFError(f"architecture {arch!r} is not supported; supported: {SUPPORTED}")
    return layout


# GGUF tensors that are not model weights (derived from the config by the converter): a merged
# export copies them from the base GGUF unchanged.
_DERIVED_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def _write_gguf(path, arch: str, kv_fn, tensors) -> Path:
    """One GGUF file: ``kv_fn(writer)`` adds the key/values, then ``(name, array)`` tensors."""
    import gguf

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), arch)
        kv_fn(w)
        for name, arr in tensors:
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return atomic.write_file(path, write)


# --------------------------------------------------------------------------- reading

# END_OF_TURN_TEXTS (turns.py): control tokens that llama.cpp also treats as end-of-generation;
# used when the GGUF metadata names only one eos id.


def check_gguf_file(path: Path) -> None:
    """Raise GGUFError unless ``path`` is a file starting with the GGUF magic bytes."""
    if not path.exists():
        raise GGUFError(f"file not found: {path}")
    if not path.is_file():
        raise GGUFError(f"not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (magic bytes {magic!r}, expected b'GGUF')")


def read_gguf_field(path, name: str, default=None):
    """One metadata value of a GGUF file (parses the whole header: use the ``models`` index when you can)."""
    import gguf
    check_gguf_file(Path(path))            # a FIFO or device would block the reader
    field = gguf.GGUFReader(path).fields.get(name)
    return default if field is None else field.contents()


def read_gguf_metadata(path: Path) -> dict:
    """What ftis-edge needs from a GGUF header, plus ``tokens`` (the vocabulary by id).

    GGUFReader takes 2-11 s on a model file: callers cache the result (``models`` keeps an index).
    """
    import gguf
    check_gguf_file(Path(path))
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
        raise GGUFError(f"cannot parse GGUF file {path}: {e}") from None
    fields = reader.fields

    def get(name, default=None):
        f = fields.get(name)
        return default if f is None else f.contents()

    arch = get("general.architecture")
    if arch is None:
        raise GGUFError(f"GGUF file {path} has no general.architecture")
    tokens = get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(f"GGUF file {path} has no tokenizer (tokenizer.ggml.tokens)")
    types = get("tokenizer.ggml.token_type") or [0] * len(tokens)
    eos = get("tokenizer.ggml.eos_token_id")
    eog = [i for i in (eos, get("tokenizer.ggml.eot_token_id"), get("tokenizer.ggml.eom_token_id")) if i is not None]
    for i, (tok, typ) in enumerate(zip(tokens, types)):
        if tok in END_OF_TURN_TEXTS and typ == 3 and i not in eog:   # control tokens only
            eog.append(i)
    n_head = get(f"{arch}.attention.head_count")
    return {
        "arch": arch,
        "name": get("general.name") or path.stem,
        "vocab_size": len(tokens),
        "n_layer": get(f"{arch}.block_count"),
        "n_head": n_head,
        "n_head_kv": get(f"{arch}.attention.head_count_kv", n_head),
        "n_ctx_train": get(f"{arch}.context_length"),
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "eos_token_ids": eog,
        "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": get("tokenizer.chat_template"),
        "file_type": get("general.file_type"),
        "tokenizer_model": get("tokenizer.ggml.model"),
        "tokenizer_pre": get("tokenizer.ggml.pre"),
        "tokens": list(tokens),
    }


# GGUF metadata value types (the file format's own numbering) -> struct code; 8 string, 9 array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf_header(path) -> tuple[dict, list[tuple[str, int]]]:
    """The scalar metadata (arrays: their length) and (name, n_elements) of every tensor, read
    straight from the header: ~0.1 s where GGUFReader takes seconds (it parses the vocabulary
    and maps every tensor). For memory estimates (fit.py), which need shapes, not weights."""
    import mmap
    import struct
    check_gguf_file(Path(path))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 4

        def take(fmt: str):
            nonlocal pos
            value = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return value[0]

        def string() -> str:
            nonlocal pos
            n = take("Q")
            pos += n
            return bytes(buf[pos - n:pos]).decode("utf-8", errors="replace")

        def skip(vtype: int) -> None:
            nonlocal pos
            if vtype == 8:
                n = take("Q")
                pos += n
            elif vtype in _GGUF_SCALARS:
                pos += struct.calcsize("<" + _GGUF_SCALARS[vtype])
            else:
                raise GGUFError(f"{path}: unknown GGUF value type {vtype}")

        try:
            version = take("I")
            if version < 2:
                raise GGUFError(f"{path}: GGUF version {version} is too old (2 or later)")
            n_tensors, n_kv = take("Q"), take("Q")
            meta: dict = {}
            for _ in range(n_kv):
                key, vtype = string(), take("I")
                if vtype == 9:                       # array: keep its length, skip its items
                    etype, count = take("I"), take("Q")
                    if etype in _GGUF_SCALARS:
                        pos += count * struct.calcsize("<" + _GGUF_SCALARS[etype])
                    else:
                        for _ in range(count):
                            skip(etype)
                    meta[key] = count
                elif vtype == 8:
                    meta[key] = string()
                elif vtype in _GGUF_SCALARS:
                    meta[key] = take(_GGUF_SCALARS[vtype])
                else:
                    raise GGUFError(f"{path}: unknown GGUF value type {vtype}")
            tensors = []
            for _ in range(n_tensors):
                name, n_dims = string(), take("I")
                n = 1
                for _ in range(n_dims):
                    n *= take("Q")
                take("I"), take("Q")                 # type, offset
                tensors.append((name, n))
        except struct.error:
            raise GGUFError(f"{path}: the GGUF header ends early") from None
    return meta, tensors


def llama3_rope_parameters(path) -> dict | None:
    """transformers' ``rope_parameters`` for a llama GGUF with Llama-3 rope scaling, else None.

    The converter stores that scaling only as per-frequency factors (``rope_freqs.weight``) and
    transformers' GGUF loader ignores them (measured: 0.34 nats/token off llama.cpp on a tiny model).
    The factors depend on ``original_max_position_embeddings`` only through its ratios to the
    low/high frequency factors, so fixing it and fitting the two ratios reproduces them exactly.
    """
    import gguf
    reader = gguf.GGUFReader(path)
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return None
    arch = reader.fields["general.architecture"].contents()
    base = float(reader.fields[f"{arch}.rope.freq_base"].contents()) if f"{arch}.rope.freq_base" in reader.fields \
        else 10000.0
    factors = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
    dim = 2 * len(factors)
    wavelen = 2 * np.pi * base ** (np.arange(0, dim, 2) / dim)
    big = float(factors.max())
    ctx_field = reader.fields.get(f"{arch}.context_length")
    # any value works (see above); below the context length so transformers does not warn
    old_ctx = float(ctx_field.contents()) / max(big, 1.0) if ctx_field is not None else 8192.0
    smooth = (factors > 1 + 1e-6) & (factors < big - 1e-6)
    unscaled, scaled = wavelen[factors <= 1 + 1e-6], wavelen[factors >= big - 1e-6]
    if big <= 1 or not len(unscaled) or not len(scaled):
        raise GGUFError(f"{path}: cannot recover Llama-3 rope scaling from rope_freqs")
    # the blend weight s(w) = a / w + b is 1 at the band's short edge and 0 at its long edge
    x = 1 / wavelen[smooth]
    y = (1 / factors[smooth] - 1 / big) / (1 - 1 / big)
    if smooth.sum() < 2:      # too few points to fit: anchor s = 1 between the last 1x and the next one
        edge = np.sqrt(unscaled.max() * (wavelen[smooth].min() if smooth.any() else scaled.min()))
        x, y = np.append(x, 1 / edge), np.append(y, 1.0)
        if smooth.sum() == 0:     # and s = 0 just above it: no wavelength falls in the band
            x, y = np.append(x, 1 / (edge * 1.0001)), np.append(y, 0.0)
    a, b = np.polyfit(x, y, 1)
    width = old_ctx / a
    low = -b * width
    high = low + width
    return {"rope_type": "llama3", "rope_theta": base, "factor": big, "low_freq_factor": float(low),
            "high_freq_factor": float(high), "original_max_position_embeddings": int(old_ctx)}


# --------------------------------------------------------------------------- F16 re-export

def copy_gguf_metadata(reader, writer) -> None:
    """Copy a GGUF's key/values to a writer, except those the writer sets itself (architecture,
    file type) and the quantization version, which no longer holds for re-exported tensors."""
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type",
                                                "general.quantization_version"):
            continue
        writer.add_key_value(name, field.contents(), field.types[0],
                             sub_type=field.types[-1] if len(field.types) > 1 else None)


def export_f16_gguf(src, dst) -> Path:
    """Write an F16 GGUF of the dequantized tensors of ``src`` with all of its metadata (atomically)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tensors = []
    for t in reader.tensors:
        data = gguf.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))   # GGUF lists ne0 first; numpy wants it last
        data = np.asarray(data, dtype=np.float32).reshape(shape)
        tensors.append((t.name, data.astype(np.float16) if data.ndim >= 2 else data))

    def kv(w):
        copy_gguf_metadata(reader, w)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    return _write_gguf(dst, arch, kv, tensors)


# --------------------------------------------------------------------------- LoRA adapters

# peft / HF module name -> GGUF tensor stem (see llama.cpp's gguf-py tensor_mapping).
GGUF_MODULE = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
               "qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}     # phi3's fused projections

# Architectures whose attention / MLP projections are fused: the usual LoRA target names map to these.
FUSED_MODULES = {"phi3": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}}


def lora_targets_for(arch: str, targets) -> list[str]:
    """The module names a LoRA on ``targets`` means in this architecture (phi3: q/k/v -> qkv_proj)."""
    fused = FUSED_MODULES.get(arch, {})
    out = []
    for t in targets:
        t = fused.get(t, t)
        if t not in out:
            out.append(t)
    return out
_LAYER_MODULE = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf ``LlamaModel.permute``), rows of a [out, ...] array.

    HF stores each head's rotary dims as two halves; GGUF interleaves them. transformers' GGUF loader
    applies the inverse (``LlamaTensorProcessor._reverse_permute_weights``).
    """
    out = w.shape[0]
    if out % (2 * n_head):
        raise GGUFError(f"cannot permute {out} rows into {n_head} heads")
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _lora_layers(peft_model):
    """(layer index, module short name, LoraLayer) for every LoRA-wrapped linear of the active adapter."""
    from peft.tuners.lora import LoraLayer
    found = []
    for name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        match = _LAYER_MODULE.search(name)
        if not match or match.group(2) not in GGUF_MODULE:
            raise GGUFError(f"LoRA on {name!r} has no GGUF adapter equivalent "
                            f"(supported: {', '.join(GGUF_MODULE)} inside decoder layers)")
        found.append((int(match.group(1)), match.group(2), module))
    if not found:
        raise GGUFError("the model has no LoRA layers")
    return found


def write_gguf_lora(peft_model, path, *, arch: str, n_head: int, n_head_kv: int, alpha: float | None = None,
                    permute: bool | None = None) -> Path:
    """Write the active peft LoRA adapter as a GGUF LoRA adapter file for llama.cpp (atomically).

    llama.cpp scales each adapter by ``alpha / rank``; ``alpha`` defaults to peft's effective
    ``scaling * r`` so both engines apply the same update. ``permute`` overrides the architecture's
    q/k row permutation (None: as its converter does; True/False only so tests can show that
    the wrong layout fails).
    """
    import gguf

    layers = _lora_layers(peft_model)
    tensors: list[tuple[str, np.ndarray]] = []
    effective_alpha = set()
    for layer, short, module in layers:
        adapter = module.active_adapters[0]
        a = module.lora_A[adapter].weight.detach().float().cpu().numpy()   # [r, in]
        b = module.lora_B[adapter].weight.detach().float().cpu().numpy()   # [out, r]
        effective_alpha.add(round(float(module.scaling[adapter]) * a.shape[0], 6))
        if (arch_layout(arch).permute_qk if permute is None else permute) and short in ("q_proj", "k_proj"):
            b = permute_rows(b, n_head if short == "q_proj" else n_head_kv)
        stem = f"blk.{layer}.{GGUF_MODULE[short]}.weight"
        tensors += [(f"{stem}.lora_a", np.ascontiguousarray(a, dtype=np.float32)),
                    (f"{stem}.lora_b", np.ascontiguousarray(b, dtype=np.float32))]
    if alpha is None:
        if len(effective_alpha) != 1:
            raise GGUFError(f"modules have different scaling*rank {sorted(effective_alpha)}: "
                            "a GGUF adapter holds one alpha")
        alpha = effective_alpha.pop()

    def kv(w):
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))

    return _write_gguf(path, arch, kv, tensors)


# --------------------------------------------------------------------------- merged export

def merged_state_dict(model) -> dict:
    """HF parameter name -> fp32 weight with any LoRA delta merged in (the model is not modified)."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and module.active_adapters:
            with torch.no_grad():
                deltas[name + ".weight"] = sum(module.get_delta_weight(a).float()
                                               for a in module.active_adapters if a in module.lora_A)
    out = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        t = tensor.detach().float()
        if name in deltas:
            t = t + deltas[name].to(t.device)
        out[name] = t.cpu()
    return out


def export_merged_gguf(model, base_gguf, path, *, dtype: str = "f16") -> Path:
    """Write a full GGUF: the base GGUF's metadata with the model's current (merged) weights.

    HF names map to GGUF names through gguf-py's tensor map (the inverse of transformers' GGUF loader);
    the architecture's ``ArchLayout`` is re-applied (llama q/k rows re-permuted, gemma3 norm weights
    get their +1 back). Matrices are stored as ``dtype`` (f16 or f32), 1-D tensors as F32 like
    llama.cpp's converter does.
    """
    import gguf

    if dtype not in ("f16", "f32"):
        raise GGUFError(f"dtype must be 'f16' or 'f32', got {dtype!r}")
    reader = gguf.GGUFReader(str(base_gguf))
    arch = reader.fields["general.architecture"].contents()
    arch_enum = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_enum is None or arch not in ARCH_LAYOUTS:
        raise GGUFError(f"merged export of a {arch!r} GGUF is not supported; supported: {SUPPORTED}")
    layout = ARCH_LAYOUTS[arch]
    state = merged_state_dict(model)
    config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    n_layer = config.num_hidden_layers
    n_head, n_head_kv = config.num_attention_heads, config.num_key_value_heads
    name_map = gguf.get_tensor_name_map(arch_enum, n_layer)
    gguf_to_hf = {}
    for hf_name in state:
        stem, _, suffix = hf_name.rpartition(".")
        g = name_map.get_name(stem)
        if g is not None:
            gguf_to_hf[f"{g}.{suffix}"] = hf_name

    np_dtype = np.float16 if dtype == "f16" else np.float32
    file_type = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    tensors = []
    for t in reader.tensors:
        expected = tuple(int(x) for x in reversed(t.shape))   # GGUF shapes are listed fastest-first
        if t.name in _DERIVED_TENSORS:
            tensors.append((t.name, np.asarray(t.data, dtype=np.float32).reshape(expected).copy()))
            continue
        hf_name = gguf_to_hf.get(t.name)
        if hf_name is None:
            raise GGUFError(f"base GGUF tensor {t.name!r} has no weight in the model")
        w = state[hf_name].numpy()
        if t.name in ("token_embd.weight", "output.weight") and w.shape[1:] == expected[1:] \
                and w.shape[0] > expected[0]:
            w = w[:expected[0]]     # the converter drops padding rows past the tokenizer (gemma3)
        if w.shape != expected:
            raise GGUFError(f"{t.name}: model weight {w.shape} != base GGUF {expected}")
        if layout.permute_qk and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = permute_rows(w, n_head if ".attn_q." in t.name else n_head_kv)
        if layout.norm_offset and t.name.endswith("norm.weight"):
            w = w + layout.norm_offset
        tensors.append((t.name, np.ascontiguousarray(w.astype(np.float32 if w.ndim == 1 else np_dtype))))

    def kv(w):
        copy_gguf_metadata(reader, w)
        w.add_file_type(file_type)

    return _write_gguf(path, arch, kv, tensors)


# --------------------------------------------------------------------------- HF -> GGUF, quantize

LLAMA_CPP_VERSION = "0.3.36"     # the llama-cpp-python whose sdist install.sh keeps the converter from


def converter_dir() -> Path:
    """Where install.sh keeps llama.cpp's convert_hf_to_gguf.py (+ conversion/, gguf-py/)."""
    from ..common.paths import cache_dir
    env = os.environ.get("FTIS_CONVERTER")
    return Path(env).expanduser() if env else cache_dir() / f"llama.cpp-convert-{LLAMA_CPP_VERSION}"


def convert_hf_to_gguf(hf_dir, dst, *, outtype: str = "f16", timeout_s: float = 3600,
                       allow_model_code: bool = False) -> Path:
    """Convert an HF model directory to GGUF with llama.cpp's own converter (a subprocess; atomic).

    The converter brings its own gguf-py (it puts it first on sys.path), matching the llama.cpp
    that loads the result. Unless ``allow_model_code`` (the user trusts this model), it runs with
    transformers' loader of a folder's own code disabled (model_code.GUARDED_CONVERTER).
    """
    import subprocess

    script = converter_dir() / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise GGUFError(f"llama.cpp's converter is missing ({script}); run ./install.sh again")

    def write(tmp: Path) -> None:
        from ..common.child import python_command, python_env
        from .model_code import GUARDED_CONVERTER, RUN_CONVERTER
        runner = RUN_CONVERTER if allow_model_code else GUARDED_CONVERTER
        cmd = python_command("-c", runner, str(script), str(hf_dir), "--outfile", str(tmp), "--outtype", outtype)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=python_env())
        except subprocess.TimeoutExpired:
            raise GGUFError(f"converting {hf_dir} to GGUF took more than {timeout_s:.0f} s") from None
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
            raise GGUFError(f"llama.cpp's converter failed on {hf_dir}: {lines[-1] if lines else r.returncode}")

    return atomic.write_file(dst, write)


QUANT_TYPES = {"f16": "LLAMA_FTYPE_MOSTLY_F16", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
               "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def quantize_gguf(src, dst, kind: str, *, n_threads: int = 0) -> Path:
    """Quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``; atomic)."""
    import llama_cpp

    if kind not in QUANT_TYPES:
        raise GGUFError(f"quantization must be one of {', '.join(QUANT_TYPES)}, got {kind!r}")

    def write(tmp: Path) -> None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, QUANT_TYPES[kind])
        params.nthread = n_threads
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise GGUFError(f"llama.cpp could not quantize {src} to {kind} (code {rc})")

    return atomic.write_file(dst, write)
