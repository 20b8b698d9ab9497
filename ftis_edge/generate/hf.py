"""The PyTorch / transformers backend: the backend steps of loop.py on an HF causal LM.

The prompt is prefilled once and the KV cache is repeated for the n sequences; finished sequences
are dropped from the batch (``Cache.batch_select_indices``). Stops are loop.py's; sampling runs in
torch on the model's device (torch_sampling.py: the numpy sampler's distribution and exact log-prob
of the sampled token, float32), so on a GPU only the sampled ids and log-probs reach the host at each
step, never the [n, vocab] logits. bf16 autocast on GPUs that support it.

Several prompts (``generate_many``: an eval) decode together in padded batches of up to
``batch_rows`` sequences, their shared prefix decoded once (hf_batch.py).

The model may be the learner's live (peft-wrapped) policy: generation runs under no_grad in
eval mode and restores train mode afterwards. There is therefore nothing to sync for this
backend: ``sync_weights`` and ``set_adapter`` only record the version (the weights already are
the policy).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import GeneratorOptions
from .hf_batch import PaddedBatch, cache_of
from .loop import SamplingGenerator

BATCH_ROWS = 32     # sequences of several prompts decoded together: an in-run eval's 32 prompts in one batch


class HFGenerator(SamplingGenerator):
    """Samples groups from an HF causal LM on ``device`` (default: where the model already is)."""

    backend = "hf"
    precision = "f32"
    loads_weight_files = False     # samples from the learner's live model: sync writes no file
    # facts callers ask before building one (base.GeneratorBackend)
    gguf_weights = False           # transformers weights (a run's GGUF adapter is not its to load)
    lora_targets = None            # peft adapters on any linear the model has
    weight_precisions = ("f32",)
    context_limit = None           # the model's own (max_position_embeddings)
    memory_on_learner_device = True     # its KV cache sits beside the learner's weights

    def __init__(self, model, tokenizer, *, device=None, eos_token_ids: Sequence[int] | None = None,
                 batch_size: int | None = None, n_ctx: int | None = None, batch_rows: int = BATCH_ROWS):
        import torch
        super().__init__()
        self.torch = torch
        self.model = model
        self.tokenizer = tokenizer
        # default: leave a live (learner-owned) model where it is; from_bundle picks CUDA when present
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        cfg = getattr(model, "config", None)
        text_cfg = getattr(cfg, "text_config", None) or cfg
        self.n_vocab = int(getattr(text_cfg, "vocab_size", None) or len(tokenizer))
        self.n_ctx = int(n_ctx or getattr(text_cfg, "max_position_embeddings", 2048))
        if eos_token_ids is None:
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None) or tokenizer.eos_token_id
            eos_token_ids = eos if isinstance(eos, (list, tuple)) else [eos]
        self.eos_token_ids = [int(t) for t in eos_token_ids if t is not None]
        self.batch_size = batch_size
        self._cache_kw = _cache_kwarg(model)
        self._cache = None
        self._slots: list[int] = []
        self._batch_rows = batch_rows
        self._padded: PaddedBatch | None = None     # the batch of several prompts being decoded

    @classmethod
    def from_bundle(cls, bundle, device=None, **kw) -> "HFGenerator":
        """Load the bundle's float32 HF weights (converted from the GGUF once and cached)."""
        return cls._on_weights(bundle, None, device=device, **kw)

    @classmethod
    def _on_weights(cls, bundle, adapter, device=None, **kw) -> "HFGenerator":
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(bundle.hf_dir(), dtype=torch.float32)
        if adapter is not None:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, str(Path(adapter).expanduser()))
        kw.setdefault("eos_token_ids", bundle.eos_token_ids)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(model, bundle.tokenizer(), device=device, **kw)

    @classmethod
    def create(cls, bundle, options: GeneratorOptions) -> "HFGenerator":
        """The registry's factory: the learner's live policy when given, else the bundle's weights
        (+ a peft adapter folder)."""
        if options.threads:
            import torch
            torch.set_num_threads(options.threads)
        rows = options.batch_rows or BATCH_ROWS
        if options.policy is not None:
            return cls(options.policy, bundle.tokenizer(), eos_token_ids=bundle.eos_token_ids, batch_rows=rows)
        gen = cls._on_weights(bundle, options.adapter, batch_rows=rows)
        if options.adapter:
            gen.set_adapter(options.adapter, 1)
        return gen

    @staticmethod
    def adapter_problem(path: Path) -> str | None:
        """Why ``path`` cannot be this backend's adapter, or None."""
        if not (path / "adapter_config.json").is_file():
            return "not a peft adapter directory (no adapter_config.json)"
        return None

    @staticmethod
    def model_problem(bundle) -> str | None:
        """Why this backend cannot sample from ``bundle``, or None: any supported model converts."""
        return None

    @staticmethod
    def lora_problem(targets) -> str | None:
        """peft puts LoRA on any layer the model has (preflight checks the model's layers)."""
        return None

    @staticmethod
    def gpu_problem(device: str) -> str | None:
        """torch runs where the learner does."""
        return None

    @staticmethod
    def memory(shape, setup, kv_cells: int) -> dict:
        """fit.py: bytes it adds at a node's peak: its KV cache (the weights are the learner's)."""
        return {"kv cache": 4 * 2 * shape.n_layer * shape.kv_dim * kv_cells}        # K and V, f32

    def set_adapter(self, path, version: int) -> None:
        """No-op apart from recording the version: this backend samples from the live weights."""
        self.adapter_path = None if path is None else str(path)
        self.adapter_version = version

    def sync_weights(self, exporter, version: int) -> dict:
        """Nothing to load: the model is the learner's policy itself; record the version (and
        let ``exporter`` keep a person's copy of a LoRA adapter)."""
        exporter.keep_latest(version)
        self.set_adapter(None, version)
        return {"sync/mode": "none", "sync/version": version, "sync/write_s": 0.0, "sync/apply_s": 0.0,
                "sync/bytes": 0}

    def close(self) -> None:
        self.model = self._cache = None

    # ------------------------------------------------------------------ backend steps (loop.py)
    @contextlib.contextmanager
    def _inference(self):
        was_training = self.model.training
        self.model.eval()
        try:
            with self.torch.no_grad(), self._autocast():
                yield
        finally:
            self._cache = self._padded = None   # the KV cache is per call: free it between calls
            if was_training:
                self.model.train()

    def _autocast(self):
        """bf16 matmuls on a GPU that has them (the sampler still works in float32)."""
        torch = self.torch
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _rng(self, seed):
        """Sampling happens in torch on the model's device: a torch generator there."""
        from .torch_sampling import device_generator
        return device_generator(self.device, seed)

    def _batch_size(self, n: int) -> int:
        return self.batch_size or n

    def _prefill_group(self, ids: list[int], k: int) -> np.ndarray:
        res = self.model(input_ids=self.torch.tensor([ids], device=self.device), use_cache=True,
                         logits_to_keep=1)
        self._padded = None
        self._cache = cache_of(res)
        if k > 1:
            self._cache.batch_repeat_interleave(k)
        self._slots = list(range(k))
        return res.logits[0, -1]               # stays on the device: sampled there (loop._sample)

    def _batch_start(self, prompts: list[list[int]], k: int, shared: int) -> list:
        self._padded = PaddedBatch(self.model, self.device, self._cache_kw)
        return self._padded.start(prompts, k, shared)

    def _decode_step(self, slots: list[int], tokens: list[int], positions: list[int]) -> np.ndarray:
        if self._padded is not None:
            return self._padded.step(slots, tokens, positions)
        torch = self.torch
        if len(slots) < len(self._slots):        # drop the finished sequences' cache rows
            row = {s: r for r, s in enumerate(self._slots)}
            self._cache.batch_select_indices(torch.tensor([row[s] for s in slots], device=self.device))
        self._slots = list(slots)
        step_ids = torch.tensor([[t] for t in tokens], device=self.device)
        res = self.model(input_ids=step_ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: self._cache})
        self._cache = cache_of(res)
        return res.logits[:, -1]

    def _completion_logits(self, ids: list[int], completions: list[list[int]]) -> list[np.ndarray]:
        """One right-padded batched forward of prompt + completion."""
        torch = self.torch
        seqs = [ids + c for c in completions]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits.float().cpu().numpy()
        p = len(ids)
        return [logits[i, p - 1:p - 1 + len(c)] for i, c in enumerate(completions)]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; earlier ``past_key_values``."""
    import inspect
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"

