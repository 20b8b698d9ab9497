"""Group generation with a PyTorch / transformers model and exact behaviour log-probs.

The sampling loop is written out (prefill once, then one token per step with the KV cache), and
each step's raw logits go through the same numpy sampler as the llama.cpp backend
(sampling.py), so the log-prob contract and the seeding are identical across backends. The
prompt is prefilled once and the cache is repeated for the n sequences; finished sequences are
dropped from the batch (``Cache.batch_select_indices``).

The model may be the learner's live (peft-wrapped) policy: generation runs under no_grad in
eval mode and restores train mode afterwards. There is therefore nothing to "sync" for this
backend: ``set_adapter`` only records the version (the weights already are the policy).

EOS convention as in llamacpp.py: the stopping token is in ``token_ids``/``logprobs``, not in ``text``.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .base import Completion, SamplerSettings
from .sampling import GenerationError, check_prompt, check_sampler, sample_tokens, token_logprobs


class HFGenerator:
    """Samples groups from an HF causal LM on ``device`` (default: where the model already is)."""

    backend = "hf"

    def __init__(self, model, tokenizer, *, device=None, eos_token_ids: Sequence[int] | None = None,
                 batch_size: int | None = None, n_ctx: int | None = None):
        import torch
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
        self._eos = set(self.eos_token_ids)
        self.batch_size = batch_size
        self._cache_kw = _cache_kwarg(model)
        self.adapter_path: str | None = None
        self.adapter_version: int | None = None
        self.stats: dict = {}
        self.record_logits = False
        self.last_logits: list[np.ndarray] = []

    @classmethod
    def from_bundle(cls, bundle, device=None, **kw) -> "HFGenerator":
        """Load the bundle's float32 HF weights (converted from the GGUF once and cached)."""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(bundle.hf_dir(), dtype=torch.float32)
        kw.setdefault("eos_token_ids", bundle.eos_token_ids)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(model, bundle.tokenizer(), device=device, **kw)

    def set_adapter(self, path, version: int) -> None:
        """No-op apart from recording the version: this backend samples from the live weights."""
        self.adapter_path = None if path is None else str(path)
        self.adapter_version = version

    def close(self) -> None:
        self.model = None

    @property
    def tok_s(self) -> float:
        return self.stats.get("tok_s", 0.0)

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids: Sequence[int], n: int, sampler: SamplerSettings, *,
                 ignore_eos: bool = False) -> list[Completion]:
        """Sample ``n`` completions of one prompt (in batches of ``batch_size``, default all n)."""
        check_sampler(sampler)
        if n < 1:
            raise GenerationError(f"n must be >= 1, got {n}")
        ids = check_prompt(prompt_ids, self.n_vocab, sampler.max_new_tokens, self.n_ctx)
        rng = np.random.default_rng(sampler.seed)
        was_training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        self.last_logits = []
        out: list[Completion] = []
        try:
            with self.torch.no_grad():
                step = self.batch_size or n
                for start in range(0, n, step):
                    out += self._generate_batch(ids, min(step, n - start), sampler, rng, ignore_eos)
        finally:
            if was_training:
                self.model.train()
        seconds = time.perf_counter() - t0
        n_tokens = sum(len(c.token_ids) for c in out)
        self.stats = {"tokens": n_tokens, "seconds": seconds, "tok_s": n_tokens / max(seconds, 1e-9),
                      "prompt_tokens": len(ids), "n": n}
        return out

    def _generate_batch(self, ids, k, sampler, rng, ignore_eos) -> list[Completion]:
        torch = self.torch
        prompt = torch.tensor([ids], device=self.device)
        res = self.model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache = _cache_of(res)
        if k > 1:
            cache.batch_repeat_interleave(k)
        logits = res.logits[0, -1].float().cpu().numpy()[None].repeat(k, axis=0)
        tokens: list[list[int]] = [[] for _ in range(k)]
        logps: list[list[float]] = [[] for _ in range(k)]
        finish = ["length"] * k
        raw: list[list[np.ndarray]] = [[] for _ in range(k)]
        live = list(range(k))
        while live:
            if self.record_logits:
                for r, s in enumerate(live):
                    raw[s].append(logits[r].copy())
            picked, picked_lp = sample_tokens(logits, sampler, rng)
            keep_rows, still = [], []
            for r, (s, t, lp) in enumerate(zip(live, picked.tolist(), picked_lp.tolist())):
                tokens[s].append(t)
                logps[s].append(lp)
                if t in self._eos and not ignore_eos:
                    finish[s] = "stop"
                elif len(tokens[s]) < sampler.max_new_tokens:
                    keep_rows.append(r)
                    still.append(s)
            if not still:
                break
            if len(still) < len(live):
                cache.batch_select_indices(torch.tensor(keep_rows, device=self.device))
            live = still
            step_ids = torch.tensor([[tokens[s][-1]] for s in live], device=self.device)
            res = self.model(input_ids=step_ids, use_cache=True, **{self._cache_kw: cache})
            cache = _cache_of(res)
            logits = res.logits[:, -1].float().cpu().numpy()
        if self.record_logits:
            self.last_logits += [np.stack(r) for r in raw]
        settings = sampler.as_dict()
        return [Completion(token_ids=tokens[s], logprobs=logps[s],
                           text=self.tokenizer.decode([t for t in tokens[s] if t not in self._eos],
                                                      skip_special_tokens=False),
                           finish_reason=finish[s], sampler=dict(settings)) for s in range(k)]

    # ------------------------------------------------------------------ scoring
    def score(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]],
              temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> list[np.ndarray]:
        """Per-token log-probs of given completions (one right-padded batched forward)."""
        torch = self.torch
        ids = check_prompt(prompt_ids, self.n_vocab, 0, self.n_ctx)
        comps = [list(map(int, c)) for c in completions]
        seqs = [ids + c for c in comps]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits.float().cpu().numpy()
        finally:
            if was_training:
                self.model.train()
        p = len(ids)
        return [token_logprobs(logits[i, p - 1:p - 1 + len(c)], c, temperature, top_k, top_p) if c else np.zeros(0)
                for i, c in enumerate(comps)]


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; earlier ``past_key_values``."""
    import inspect
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
