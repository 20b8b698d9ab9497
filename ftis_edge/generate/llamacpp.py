"""The llama.cpp backend (low-level API): the backend steps of loop.py, adapters, weight reloads.

One GRPO group = one prompt, n completions. The prompt is decoded once with all n sequence ids
(the KV cache is unified, so its cells are shared); then every live sequence advances one token
per ``llama_decode`` call, all in one ``llama_batch``. Sampling, log-probs and stops are
loop.py's (numpy, from the processed distribution), so the recorded log-prob is exactly that of
the sampled token.

EOS convention: the end-of-generation token that stopped a sequence IS included in
``token_ids`` and ``logprobs`` (it was sampled, and it is what teaches the policy to stop);
``text`` excludes it. Other control tokens sampled mid-completion are rendered in ``text`` (as
the HF backend does), so a receiver can check that the ids decode to the text it grades.
"""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import GenerationError, GeneratorOptions
from .loop import SamplingGenerator

_BACKEND_READY = False
GROWABLE_START = 512      # tokens per sequence a growable context starts with (prompt + completion)
N_UBATCH = 512            # llama.cpp's n_ubatch (= n_batch by default): the rows of its compute buffer
Q8_0_BYTES_PER_PARAM = 34 / 32     # Q8_0: 32 weights in 34 bytes (an HF model's "quantized" generator)
# the decoder linears the GGUF LoRA writer (models/gguf_io.py) knows: the layers our adapters may hold
LORA_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _llama():
    """Import llama_cpp and initialise its backend once (import is slow-ish; keep it lazy)."""
    global _BACKEND_READY
    import llama_cpp
    if not _BACKEND_READY:
        llama_cpp.llama_backend_init()
        _BACKEND_READY = True
    return llama_cpp


class LlamaCppGenerator(SamplingGenerator):
    """A llama.cpp model + context that samples groups of completions (see module doc).

    ``n_ctx`` is the per-sequence context: prompt + max_new_tokens must fit in it. The unified KV
    cache holds ``n_ctx * max_group`` cells so that a full group always fits. Without ``n_ctx`` the
    context starts at 512 tokens per sequence and grows to the longest request seen, so it follows
    the task (G x (prompt + max new tokens)) instead of a fixed 2048 per sequence.

    ``n_shared``: leading prompt tokens that every sequence shares (an eval's system + few-shot
    prefix, decoded once by the pool and given to each slot by id): the cache then holds
    ``n_shared + max_group * (n_ctx - n_shared)`` cells, the prefix once instead of once per slot.
    A group still fits (its prompt is stored once too), and the pool uses only as many slots as
    its cells hold for sure (``_pool_slots``), so a decode never runs out of cells.
    """

    backend = "llamacpp"
    # facts callers ask before building one (base.GeneratorBackend)
    gguf_weights = True                 # samples from GGUF files: the model's, a run's adapter
    lora_targets = LORA_LAYERS
    weight_precisions = ("f16", "quantized")
    context_limit = None                # a node's context grows with the task (GROWABLE_START on)
    memory_on_learner_device = False    # weights, KV cache and compute buffer live in RAM

    def __init__(self, gguf_path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = 512, max_group: int = 16, n_shared: int = 0,
                 eos_token_ids: Sequence[int] | None = None, verbose: bool = False):
        super().__init__()
        self.llama = _llama()
        from llama_cpp import _logger
        _logger.set_verbose(verbose)
        if (max_group < 1 or (n_ctx is not None and n_ctx < 8) or n_batch < 1
                or not 0 <= n_shared < (n_ctx or GROWABLE_START)):
            raise GenerationError(f"bad generator sizes: n_ctx={n_ctx}, n_batch={n_batch}, max_group={max_group}, "
                                  f"n_shared={n_shared}")
        # n_ctx given: a fixed budget per sequence (overflow is an error); None: start small and
        # grow to what the requests need (the node's default: the context follows the task)
        self._growable = n_ctx is None
        self.n_ctx = n_ctx or GROWABLE_START
        self.n_batch = n_batch
        self.max_group = max_group
        self.n_shared = n_shared
        self.n_cells = 0                      # KV cells of the context (llama.cpp rounds up to 256)
        self._chunk = n_batch                 # tokens per llama_decode (what the context accepts)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.precision = "gguf"               # "f16" / "quantized" when built by from_bundle
        self._eos_override = list(eos_token_ids) if eos_token_ids is not None else None
        self.adapter_scale = 1.0
        self._adapter = None
        self._model = self._ctx = None
        self._batch = self.llama.llama_batch_init(max(n_batch, max_group), 0, max_group)
        self._load(Path(gguf_path))

    @classmethod
    def from_bundle(cls, bundle, precision: str = "f16", **kw) -> "LlamaCppGenerator":
        """Generator on the bundle's GGUF: precision "f16" (re-export, matches PyTorch) or "quantized"."""
        kw.setdefault("eos_token_ids", bundle.eos_token_ids)
        gen = cls(bundle.generator_gguf(precision), **kw)
        gen.precision = precision
        return gen

    @classmethod
    def create(cls, bundle, options: GeneratorOptions) -> "LlamaCppGenerator":
        """The registry's factory: the bundle's GGUF at ``options.precision`` (+ a GGUF LoRA file)."""
        kw = {"n_ctx": options.n_ctx} if options.n_ctx else {}
        gen = cls.from_bundle(bundle, precision=options.precision, n_threads=options.threads,
                              max_group=options.max_group, n_shared=options.n_shared, **kw)
        if options.adapter:
            gen.set_adapter(str(Path(options.adapter).expanduser()), version=1)
        return gen

    @staticmethod
    def adapter_problem(path: Path) -> str | None:
        """Why ``path`` cannot be this backend's adapter, or None."""
        return None if path.is_file() else "no such file (llamacpp wants a GGUF LoRA file)"

    @staticmethod
    def model_problem(bundle) -> str | None:
        """Why this backend cannot sample from ``bundle`` (models.ModelBundle), or None."""
        if bundle.gguf_path is None:
            return ("is an HF model without a GGUF file, which the llama.cpp backend needs; set model.backend = "
                    "\"hf\" (or convert it with llama.cpp's convert_hf_to_gguf.py and point model.spec at the .gguf)")
        return None

    @staticmethod
    def lora_problem(targets) -> str | None:
        """Why LoRA on ``targets`` cannot reach this generator (its adapter format), or None."""
        unknown = [t for t in targets if t not in LORA_LAYERS]
        if unknown:
            return (f"{', '.join(map(repr, unknown))} cannot be written as a llama.cpp LoRA adapter; "
                    f"use {', '.join(LORA_LAYERS)}")
        return None

    @staticmethod
    def has_gpu() -> bool:
        """Whether the installed llama.cpp can offload to a GPU (CUDA or Metal build)."""
        try:
            import llama_cpp
            return bool(llama_cpp.llama_supports_gpu_offload())
        except Exception:                 # noqa: BLE001 - not installed / an older binding: assume CPU
            return False

    @classmethod
    def gpu_problem(cls, device: str) -> str | None:
        """Why it cannot run where the learner does (``device``), or None."""
        if device == "cpu" or cls.has_gpu():
            return None
        return ("this llama.cpp build is CPU-only (install the CUDA toolkit and re-run ./install.sh for a GPU "
                "llama.cpp)")

    @staticmethod
    def memory(shape, setup, kv_cells: int) -> dict:
        """fit.py: bytes it holds at a node's peak, per part (``shape``: fit.ModelShape; ``setup``:
        fit.Setup; ``kv_cells``: the cells a group of sequences needs)."""
        if setup.precision == "quantized":     # the shipped GGUF, or the Q8_0 an HF model is quantized to
            weights = shape.file_bytes or int(Q8_0_BYTES_PER_PARAM * shape.n_params)
        else:
            weights = 2 * shape.n_params        # the F16 re-export
        return {"gen weights": weights,
                "kv cache": 2 * 2 * shape.n_layer * shape.kv_dim * _round_up(kv_cells, 256),     # K and V, f16
                # its compute buffer holds a batch's worth of logits (a scored or prefilled batch) and activations
                "gen compute": 4 * N_UBATCH * (shape.vocab + shape.ffn + 4 * shape.hidden)}

    # ------------------------------------------------------------------ model / context lifetime
    def _load(self, path: Path) -> None:
        ll = self.llama
        if not path.is_file():
            raise GenerationError(f"GGUF file not found: {path}")
        mparams = ll.llama_model_default_params()
        model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise GenerationError(f"llama.cpp could not load {path}")
        self._model, self.gguf_path = model, path
        try:
            self._new_context()
        except GenerationError:
            ll.llama_model_free(model)
            self._model = None
            raise
        self._vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        if self._eos_override is not None:
            self.eos_token_ids = list(self._eos_override)
        else:
            self.eos_token_ids = [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, t)]
        self._logits_buf = np.empty((self.max_group, self.n_vocab), dtype=np.float32)

    def _new_context(self) -> None:
        """(Re)create the context: ``n_ctx`` cells per sequence for ``max_group`` sequences (less the
        ``n_shared`` prefix they share), in one unified KV cache (a prompt shared by a group is stored
        once). Sized by the task, not a fixed 2048 per sequence, so the cache stays small and within
        the model's trained context."""
        ll = self.llama
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = self.n_shared + self.max_group * (self.n_ctx - self.n_shared)
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.max_group + 1       # + the pool's shared-prefix keeper
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = True
        ctx = ll.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise GenerationError(f"llama.cpp could not create a context for {self.gguf_path} "
                                  f"(n_ctx={cparams.n_ctx})")
        self._ctx = ctx
        self.n_cells = ll.llama_n_ctx(ctx)
        # tokens per llama_decode call: llama.cpp caps n_batch at the requested n_ctx (and aborts
        # the process on a larger batch), so chunk by what the context took
        self._chunk = ll.llama_n_batch(ctx)
        self._mem = ll.llama_get_memory(ctx)
        if self._adapter:                     # an adapter is applied per context
            arr = (ll.llama_adapter_lora_p_ctypes * 1)(self._adapter)
            if ll.llama_set_adapters_lora(ctx, arr, 1, (ctypes.c_float * 1)(self.adapter_scale)) != 0:
                raise GenerationError(f"could not re-apply the LoRA adapter {self.adapter_path}")

    def _free(self) -> None:
        ll = self.llama
        if self._ctx:
            ll.llama_free(self._ctx)
        if self._model:
            ll.llama_model_free(self._model)   # also frees adapters loaded on it
        self._ctx = self._model = self._adapter = None

    def reload(self, gguf_path: str | os.PathLike, version: int | None = None) -> None:
        """Swap the base weights file (full fine-tuning sync re-exports a merged GGUF); drops any adapter."""
        self._free()
        self.adapter_path, self.adapter_version = None, version
        self._load(Path(gguf_path))

    def close(self) -> None:
        self._free()
        if self._batch is not None:
            self.llama.llama_batch_free(self._batch)
            self._batch = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ adapters
    def set_adapter(self, path: str | os.PathLike | None, version: int, scale: float = 1.0) -> None:
        """Hot-swap a GGUF LoRA adapter (None removes it); the KV cache is cleared (old-weight keys)."""
        ll = self.llama
        new = None
        if path is not None:
            if not Path(path).is_file():
                raise GenerationError(f"adapter file not found: {path}")
            new = ll.llama_adapter_lora_init(self._model, str(path).encode())
            if not new:
                raise GenerationError(f"llama.cpp could not load the LoRA adapter {path} "
                                      f"(wrong architecture or not a GGUF LoRA?)")
            arr = (ll.llama_adapter_lora_p_ctypes * 1)(new)
            rc = ll.llama_set_adapters_lora(self._ctx, arr, 1, (ctypes.c_float * 1)(scale))
        else:
            rc = ll.llama_set_adapters_lora(self._ctx, None, 0, None)
        if rc != 0:
            if new:
                ll.llama_adapter_lora_free(new)
            raise GenerationError(f"llama_set_adapters_lora failed (rc={rc}) for {path}")
        if self._adapter:
            ll.llama_adapter_lora_free(self._adapter)
        self._adapter = new
        self.adapter_path = None if path is None else str(path)
        self.adapter_version, self.adapter_scale = version, scale
        ll.llama_memory_clear(self._mem, True)

    def sync_weights(self, exporter, version: int) -> dict:
        """Have ``exporter`` (sync.WeightSync) write the policy as a GGUF LoRA (hot-swapped) or a
        merged GGUF (reloaded); nothing is written when it already holds ``version``."""
        t0 = time.perf_counter()
        path, written = exporter.export(version)
        if not written:
            return {"sync/mode": exporter.mode, "sync/version": version, "sync/write_s": 0.0,
                    "sync/apply_s": 0.0, "sync/bytes": 0, "sync/path": str(path)}
        t1 = time.perf_counter()
        if exporter.mode == "lora-adapter":
            self.set_adapter(str(path), version)
        else:
            self.reload(str(path), version)
        t2 = time.perf_counter()
        return {"sync/mode": exporter.mode, "sync/version": version, "sync/write_s": t1 - t0,
                "sync/apply_s": t2 - t1, "sync/bytes": path.stat().st_size, "sync/path": str(path)}

    # ------------------------------------------------------------------ batch helpers
    def _put(self, i: int, token: int, pos: int, seq_ids: Sequence[int], want_logits: bool) -> None:
        b = self._batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = len(seq_ids)
        for j, s in enumerate(seq_ids):
            b.seq_id[i][j] = s
        b.logits[i] = want_logits

    def _decode(self, n_tokens: int) -> None:
        self._batch.n_tokens = n_tokens
        rc = self.llama.llama_decode(self._ctx, self._batch)
        if rc == 1:
            raise GenerationError(f"llama_decode found no KV slot for {n_tokens} token(s): the {self.n_cells} "
                                  f"cells of the context are full (the sequences do not fit)")
        if rc != 0:
            raise GenerationError(f"llama_decode failed (rc={rc})")

    def _row(self, i: int) -> np.ndarray:
        ptr = self.llama.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def _prefill(self, ids: list[int], seq_ids: Sequence[int]) -> np.ndarray:
        """Decode a prompt shared by ``seq_ids``; returns (a copy of) the last position's logits."""
        for start in range(0, len(ids), self._chunk):
            chunk = ids[start:start + self._chunk]
            for j, t in enumerate(chunk):
                self._put(j, t, start + j, seq_ids, start + j == len(ids) - 1)
            self._decode(len(chunk))
        return self._row(len(chunk) - 1).copy()

    # ------------------------------------------------------------------ backend steps (loop.py)
    def _batch_size(self, n: int) -> int:
        return self.max_group

    def _prefill_group(self, ids: list[int], k: int) -> np.ndarray:
        self.llama.llama_memory_clear(self._mem, True)
        return self._prefill(ids, range(k))

    # pool steps (loop.py's continuous batching): sequence id ``max_group`` keeps the shared prefix;
    # an entering prompt's slots are given its cells (a copy of ids, not of data, in the unified cache)
    def _pool_slots(self, k: int, shared: int, per_slot: int) -> int:
        # the base rule (_batch_size), capped: every slot may need per_slot cells beyond the
        # prefix, held once, so never more slots than the cells hold
        return min(self._batch_size(k), (self.n_cells - shared) // per_slot)

    def _pool_start(self, prefix: list[int]) -> None:
        self.llama.llama_memory_clear(self._mem, True)
        if prefix:
            self._prefill(prefix, (self.max_group,))

    def _pool_step(self, feeds: list[tuple[int, int, int]], entering: list[tuple[list[int], int, list[int]]]):
        ll = self.llama
        entries = [(t, pos, (s,), True) for s, t, pos in feeds]
        last_of = []
        for tail, start, slots in entering:
            if start:
                for s in slots:
                    ll.llama_memory_seq_cp(self._mem, self.max_group, s, -1, -1)
            entries += [(t, start + i, tuple(slots), i == len(tail) - 1) for i, t in enumerate(tail)]
            last_of.append(len(entries) - 1)
        want_at = {i: r for r, i in enumerate(i for i, e in enumerate(entries) if e[3])}
        rows = np.empty((len(want_at), self.n_vocab), dtype=np.float32)
        for begin in range(0, len(entries), self._chunk):
            chunk = entries[begin:begin + self._chunk]
            for j, (t, pos, seqs, want) in enumerate(chunk):
                self._put(j, t, pos, seqs, want)
            self._decode(len(chunk))
            for j, (_, _, _, want) in enumerate(chunk):
                if want:
                    rows[want_at[begin + j]] = self._row(j)
        return rows[:len(feeds)], [rows[want_at[i]] for i in last_of]

    def _pool_release(self, slot: int) -> None:
        self.llama.llama_memory_seq_rm(self._mem, slot, -1, -1)

    def _fit_context(self, tokens_per_sequence: int, n: int) -> None:
        """Grow the context when a request needs more per sequence than it holds (rare: the caller
        sizes it from the task); the model and the adapter stay loaded."""
        if self._growable and tokens_per_sequence > self.n_ctx:
            self.n_ctx = _round_up(tokens_per_sequence)
            self._new_context()

    def _decode_step(self, slots: list[int], tokens: list[int], positions: list[int]) -> np.ndarray:
        for j, (s, t, pos) in enumerate(zip(slots, tokens, positions)):
            self._put(j, t, pos, (s,), True)
        self._decode(len(slots))
        logits = self._logits_buf[:len(slots)]
        for j in range(len(slots)):
            logits[j] = self._row(j)
        return logits

    def _completion_logits(self, ids: list[int], completions: list[list[int]]) -> list[np.ndarray]:
        """Batched prefill, ``max_group`` completions at a time: the prompt once, then every
        completion token except the last (they predict the next token)."""
        out: list[np.ndarray] = []
        for start in range(0, len(completions), self.max_group):
            group = completions[start:start + self.max_group]
            self.llama.llama_memory_clear(self._mem, True)
            first = self._prefill(ids, range(len(group)))
            entries = [(s, j) for s, c in enumerate(group) for j in range(len(c) - 1)]
            rows: dict[tuple[int, int], np.ndarray] = {}
            for begin in range(0, len(entries), self._chunk):
                chunk = entries[begin:begin + self._chunk]
                for i, (s, j) in enumerate(chunk):
                    self._put(i, group[s][j], len(ids) + j, (s,), True)
                self._decode(len(chunk))
                for i, key in enumerate(chunk):
                    rows[key] = self._row(i).copy()
            out += [np.stack([first] + [rows[(s, j)] for j in range(len(c) - 1)])
                    for s, c in enumerate(group)]
        return out

    # ------------------------------------------------------------------ text
    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        """llama.cpp's own tokenizer (used to check parity with the HF tokenizer)."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self.llama.llama_token * cap)()
        n = self.llama.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (self.llama.llama_token * cap)()
            n = self.llama.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        return list(buf[:n])

    def detokenize(self, token_ids: Sequence[int], special: bool = True) -> str:
        """Token ids -> text. Control tokens are rendered (as HF's decode does): a completion's
        text must be what its ids decode to, or intake refuses it (``token_text_mismatch``)."""
        pieces = bytearray()
        buf = ctypes.create_string_buffer(256)
        for t in token_ids:
            n = self.llama.llama_token_to_piece(self._vocab, int(t), buf, len(buf), 0, special)
            pieces += buf.raw[:max(n, 0)]
        return pieces.decode("utf-8", errors="replace")


def _round_up(n: int, step: int = 64) -> int:
    return -(-n // step) * step
