"""Learner -> generator weight sync: GGUF LoRA adapters (hot swap) and merged GGUF exports (reload).

Two artefacts, both written with llama.cpp's own ``gguf`` package:

* ``write_gguf_lora``: the peft LoRA matrices as a GGUF LoRA adapter (~2 MB, ~10 ms). llama.cpp's
  converter permutes the rows of q/k projections for the llama architecture (rotary layout), so
  lora_B of q_proj / k_proj is permuted the same way; gemma3's converter does not permute.
* ``export_merged_gguf``: the model's current weights (LoRA merged in) under the base GGUF's metadata,
  as F16 (2-D) / F32 (1-D) tensors (~7 s, 271 MB for 135M parameters).

``WeightSync`` writes one of them after each optimiser step and tells the generator to use it.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from . import atomic

from .errors import FtisError


class SyncError(FtisError, ValueError):
    """The model cannot be written in the requested form (unsupported module, shape mismatch, ...)."""


# peft / HF module name -> GGUF tensor stem (see llama.cpp's gguf-py tensor_mapping).
GGUF_MODULE = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_LAYER_MODULE = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf ``LlamaModel.permute``), rows of a [out, ...] array.

    HF stores each head's rotary dims as two halves; GGUF interleaves them. transformers' GGUF loader
    applies the inverse (``LlamaTensorProcessor._reverse_permute_weights``).
    """
    out = w.shape[0]
    if out % (2 * n_head):
        raise SyncError(f"cannot permute {out} rows into {n_head} heads")
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
            raise SyncError(f"LoRA on {name!r} has no GGUF adapter equivalent "
                            f"(supported: {', '.join(GGUF_MODULE)} inside decoder layers)")
        found.append((int(match.group(1)), match.group(2), module))
    if not found:
        raise SyncError("the model has no LoRA layers")
    return found


def write_gguf_lora(peft_model, path, *, arch: str, n_head: int, n_head_kv: int, alpha: float | None = None,
                    permute: bool = True) -> Path:
    """Write the active peft LoRA adapter as a GGUF LoRA adapter file for llama.cpp (atomically).

    llama.cpp scales each adapter by ``alpha / rank``; ``alpha`` defaults to peft's effective
    ``scaling * r`` so both engines apply the same update. ``permute=False`` skips the llama q/k row
    permutation (wrong; kept so tests can show that the permutation is needed).
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
        if arch == "llama" and permute and short in ("q_proj", "k_proj"):
            b = permute_rows(b, n_head if short == "q_proj" else n_head_kv)
        stem = f"blk.{layer}.{GGUF_MODULE[short]}.weight"
        tensors += [(f"{stem}.lora_a", np.ascontiguousarray(a)), (f"{stem}.lora_b", np.ascontiguousarray(b))]
    if alpha is None:
        if len(effective_alpha) != 1:
            raise SyncError(f"modules have different scaling*rank {sorted(effective_alpha)}: "
                            "a GGUF adapter holds one alpha")
        alpha = effective_alpha.pop()

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for name, arr in tensors:
            w.add_tensor(name, arr.astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return atomic.write_file(path, write)


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """HF parameter name -> fp32 weight with any LoRA delta merged in (the model is not modified)."""
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


def _reader_arch(reader) -> str:
    field = reader.fields["general.architecture"]
    return field.contents()


def export_merged_gguf(model, base_gguf, path, *, dtype: str = "f16") -> Path:
    """Write a full GGUF: the base GGUF's metadata with the model's current (merged) weights.

    HF names map to GGUF names through gguf-py's tensor map (the inverse of transformers' GGUF loader):
    llama q/k rows are re-permuted, gemma3 norm weights get their +1 back (transformers subtracts 1
    on load because Gemma's RMSNorm multiplies by 1 + w). Matrices are stored as ``dtype`` (f16 or
    f32), 1-D tensors as F32 like llama.cpp's converter does.
    """
    import gguf

    from .models import copy_gguf_metadata

    if dtype not in ("f16", "f32"):
        raise SyncError(f"dtype must be 'f16' or 'f32', got {dtype!r}")
    reader = gguf.GGUFReader(str(base_gguf))
    arch = _reader_arch(reader)
    arch_enum = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_enum is None or arch not in ("llama", "gemma3"):
        raise SyncError(f"merged export supports llama and gemma3 GGUFs, not {arch!r}")
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
        hf_name = gguf_to_hf.get(t.name)
        if hf_name is None:
            raise SyncError(f"base GGUF tensor {t.name!r} has no weight in the model")
        w = state[hf_name].numpy()
        expected = tuple(int(x) for x in reversed(t.shape))   # GGUF shapes are listed fastest-first
        if w.shape != expected:
            raise SyncError(f"{t.name}: model weight {w.shape} != base GGUF {expected}")
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = permute_rows(w, n_head if ".attn_q." in t.name else n_head_kv)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w + 1.0
        tensors.append((t.name, np.ascontiguousarray(w.astype(np.float32 if w.ndim == 1 else np_dtype))))

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), arch)
        copy_gguf_metadata(reader, w)
        w.add_file_type(file_type)
        for name, arr in tensors:
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return atomic.write_file(path, write)


class WeightSync:
    """After each optimiser step, ship the learner's policy to the generator.

    The generator decides how it takes new weights (``generator.sync_weights(self, version)``):
    llama.cpp asks ``export`` for a file; in mode "lora-adapter" it is a GGUF LoRA the generator
    hot-swaps, in mode "merged" a merged GGUF it reloads (full fine-tuning, or exact); mode "auto":
    lora-adapter for a LoRA learner, merged for full fine-tuning. An HF generator samples from
    ``learner.model`` itself, so it writes nothing and only records the version.

    Merged exports default to F32: one full fine-tuning step at a realistic lr (1e-5..2e-5) moves most
    weights by well under half an F16 ulp, so an F16 export rounds the update away (measured: 0.026 nats/token
    off PyTorch vs 0.001 for F32; docs/bridge.md). F32 costs 2x the disk, about the same batched speed.
    """

    def __init__(self, learner, generator, *, out_dir, arch: str, n_head: int, n_head_kv: int,
                 base_gguf=None, mode: str = "auto", dtype: str = "f32", keep: int = 2):
        if mode == "auto":
            mode = "lora-adapter" if learner.trainable == "lora" else "merged"
        if mode not in ("lora-adapter", "merged"):
            raise SyncError(f"mode must be 'auto', 'lora-adapter' or 'merged', got {mode!r}")
        if mode == "lora-adapter" and learner.trainable != "lora":
            raise SyncError("mode 'lora-adapter' needs a LoRA learner (full fine-tuning syncs with 'merged')")
        if mode == "merged" and base_gguf is None:
            raise SyncError("mode 'merged' needs base_gguf (the GGUF whose metadata the export copies)")
        self.learner, self.generator, self.mode = learner, generator, mode
        self.out_dir = Path(out_dir)
        self.arch, self.n_head, self.n_head_kv = arch, n_head, n_head_kv
        self.base_gguf, self.dtype, self.keep = base_gguf, dtype, max(1, keep)
        self._written: list[Path] = []
        self._synced_version: int | None = None

    @classmethod
    def from_bundle(cls, learner, generator, bundle, out_dir, **kwargs) -> "WeightSync":
        """Build from a ``models.ModelBundle`` (arch, head counts, base GGUF for merged exports)."""
        return cls(learner, generator, out_dir=out_dir, arch=bundle.arch, n_head=bundle.n_head,
                   n_head_kv=bundle.n_head_kv, base_gguf=bundle.gguf_path, **kwargs)

    def sync(self, version: int | None = None) -> dict:
        """Hand the current policy to the generator (its ``sync_weights``); returns metrics (seconds, bytes)."""
        version = self.learner.version if version is None else version
        info = self.generator.sync_weights(self, version)
        self._synced_version = version
        while len(self._written) > self.keep:   # older artefacts are no longer loaded anywhere
            self._written.pop(0).unlink(missing_ok=True)
        return info

    def export(self, version: int) -> tuple[Path, bool]:
        """Write the policy as this sync's artefact (GGUF LoRA or merged GGUF); (path, written).

        No optimiser step since the last sync (a round whose groups had no signal): the generator
        already has these weights, so nothing is written (rewriting the same file name would let
        the clean-up in ``sync`` delete the file in use).
        """
        if self._written and self._synced_version == version and self._written[-1].exists():
            return self._written[-1], False
        if self.mode == "lora-adapter":
            path = write_gguf_lora(self.learner.model, self.out_dir / f"adapter-v{version:06d}.gguf",
                                   arch=self.arch, n_head=self.n_head, n_head_kv=self.n_head_kv)
        else:
            path = export_merged_gguf(self.learner.model, self.base_gguf,
                                      self.out_dir / f"merged-v{version:06d}.gguf", dtype=self.dtype)
        if path not in self._written:
            self._written.append(path)
        return path, True
