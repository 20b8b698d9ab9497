"""The PyTorch policy that learns: LoRA (peft) or full fine-tuning, per-token log-probs, one F-TIS step.

``Learner.step(samples)`` runs one optimiser step over a whole batch of ``TrainSample``s. The batch is
split into micro-batches; each one calls ``objective.ftis_loss`` with ``num_samples`` = the whole batch
size, so the accumulated gradient equals the full-batch gradient. Each distinct prompt runs through the
model once and its KV cache serves every completion that shares it (``shared_prompt``); with
``share_prompts=False`` (or gradient checkpointing, which drops HF caches) every sample is a full
prompt + completion sequence, as before. With ``pack`` the completions of a micro-batch run packed
into rows behind their prompts, one forward (packing.py). Log-probs are computed only at completion
positions, a chunk of rows at a time (``head_logprob``), so the [tokens, vocab] logits (49k / 262k
columns) never all live in memory at once.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque
from pathlib import Path
from typing import Sequence

import torch

from ..metrics import metric_keys
from ..peers import plausibility
from ..errors import FtisError
from .head_logprob import head_logprob
from .logit_chunks import LOGIT_CHUNK_ROWS
from .objective import LEVELS, ftis_loss
from .precision import PRECISIONS, compute_dtype
from ..rollout.samples import OWN, TrainSample
from .packing import packable, packed_hidden
from .shared_prompt import (PromptPass, completion_hidden, length_buckets, plan_micro_batches, prompt_key,
                            run_prompt)


class LearnerError(FtisError, ValueError):
    """Bad input to the learner (a malformed sample, an unknown setting)."""


class LearnerOOM(RuntimeError):
    """The step ran out of memory. Gradients were cleared: lower ``learner.micro_batch`` and retry."""

    def __init__(self, micro_batch: int, cause: BaseException):
        super().__init__(f"out of memory at micro_batch={micro_batch}; halve learner.micro_batch and "
                         f"retry ({type(cause).__name__}: {str(cause).splitlines()[0][:200]})")
        self.micro_batch = micro_batch


def _is_oom(err: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    text = str(err).lower()
    # CUDA says "out of memory"; the CPU allocator says "can't allocate memory".
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _resolve_hf_dir(bundle_or_hf_dir) -> Path:
    if hasattr(bundle_or_hf_dir, "hf_dir"):
        return Path(bundle_or_hf_dir.hf_dir())
    path = Path(bundle_or_hf_dir)
    if not (path / "config.json").is_file():
        raise LearnerError(f"{path} is not a Hugging Face model directory (no config.json)")
    return path


TRAINABLE = ("lora", "full")        # LoRA adapters only, or every weight
PACK = True        # packing.py: 0.99-1.22x the buckets' speed at real lengths, quiet (docs/runs/bench-learner-pack-quiet.json)


class Learner:
    """A trainable policy: the HF model (optionally peft-wrapped), its optimiser and a version counter."""

    def __init__(self, bundle_or_hf_dir, *, trainable: str = "lora", lora_r: int = 8, lora_alpha: float = 16,
                 lora_dropout: float = 0.0,
                 lora_targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                 lr: float | None = None, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
                 micro_batch: int = 4, device: str | torch.device | None = None, seed: int = 0,
                 gradient_checkpointing: bool = False, dtype: torch.dtype | None = None,
                 share_prompts: bool = True, precision: str = "auto", pack: bool | None = None):
        from transformers import AutoModelForCausalLM

        if trainable not in TRAINABLE:
            raise LearnerError(f"trainable must be 'lora' or 'full', got {trainable!r}")
        if precision not in PRECISIONS:
            raise LearnerError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if micro_batch < 1:
            raise LearnerError(f"micro_batch must be >= 1, got {micro_batch}")
        self.trainable = trainable
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.micro_batch = micro_batch
        self.grad_clip = grad_clip
        self.seed = seed
        # HF layers drop the KV cache under gradient checkpointing: the prompt cannot be shared then.
        self.share_prompts = share_prompts and not gradient_checkpointing
        # a micro-batch's completions packed into rows, one forward (packing.py)
        self.pack = PACK if pack is None else pack
        self.version = 0
        self.on_micro_batch = None     # called (done, total) after each micro-batch: progress only
        self.hf_dir = _resolve_hf_dir(bundle_or_hf_dir)
        # the one precision rule (precision.py): bf16 autocast on CUDA by default, on the CPU when asked
        bf16 = compute_dtype(self.device.type, precision) == "bf16"
        self.autocast_dtype = torch.bfloat16 if bf16 else None

        torch.manual_seed(seed)  # LoRA A init is random: same seed -> same adapter
        model = AutoModelForCausalLM.from_pretrained(self.hf_dir, dtype=dtype or torch.float32)
        model.to(self.device)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if trainable == "lora":
            from peft import LoraConfig, get_peft_model
            if gradient_checkpointing:
                model.enable_input_require_grads()
            config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                target_modules=list(lora_targets), bias="none", task_type="CAUSAL_LM")
            model = get_peft_model(model, config)
        self.model = model
        self.model.train()  # dropout (LoRA dropout) only; HF LMs here have no other train-mode behaviour
        self.lora_config = dict(r=lora_r, alpha=lora_alpha, dropout=lora_dropout, targets=list(lora_targets)) \
            if trainable == "lora" else None
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        if lr is None:
            lr = 1e-4 if trainable == "lora" else 5e-6
        self.lr = lr
        self.optimizer = torch.optim.Adam(self._params, lr=lr, weight_decay=weight_decay)
        self.vocab_size = self._hf_model.config.vocab_size
        # the last calibrated plausibility threshold (plausibility.py), for a step with few own samples
        self.plausibility_threshold: float | None = None
        self.own_score_pool: deque[float] = deque(maxlen=plausibility.OWN_POOL)   # own samples' scores, over steps
        # unlikely n-grams peer samples were trained on (plausibility.RepeatMemory): each is taught once
        self.repeat_memory = plausibility.RepeatMemory()
        self.softcap = getattr(self._hf_model.config, "final_logit_softcapping", None)

    # ----------------------------------------------------------------- model parts
    @property
    def _hf_model(self):
        """The underlying transformers model (LoRA layers injected in place when peft-wrapped)."""
        return self.model.get_base_model() if self.trainable == "lora" else self.model

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Name -> tensor of every trainable parameter (the LoRA matrices, or all weights)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    # ----------------------------------------------------------------- log-probs
    def _check(self, samples: Sequence[TrainSample]) -> None:
        if not samples:
            raise LearnerError("empty batch")
        for i, s in enumerate(samples):
            if not s.completion_ids:
                raise LearnerError(f"sample {i}: empty completion")
            if not s.prompt_ids:
                raise LearnerError(f"sample {i}: empty prompt (the first completion token needs a context)")
            ids = list(s.prompt_ids) + list(s.completion_ids)
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise LearnerError(f"sample {i}: token id out of range [0, {self.vocab_size})")
            if not math.isfinite(s.advantage):
                raise LearnerError(f"sample {i}: advantage is not finite ({s.advantage})")
            if not (isinstance(s.weight, (int, float)) and 0.0 <= s.weight <= 1.0):
                raise LearnerError(f"sample {i}: weight must lie in [0, 1], got {s.weight!r}")
            if (s.span_ids is None) != (s.gen_span_logprobs is None):
                raise LearnerError(f"sample {i}: span level needs both span_ids and gen_span_logprobs")
            if s.span_ids is not None:
                n_spans = len(s.gen_span_logprobs)
                if len(s.span_ids) != len(s.completion_ids):
                    raise LearnerError(f"sample {i}: {len(s.span_ids)} span_ids for {len(s.completion_ids)} "
                                       "completion tokens")
                if min(s.span_ids) < 0 or max(s.span_ids) >= n_spans:
                    raise LearnerError(f"sample {i}: span ids must lie in [0, {n_spans})")
                if not all(math.isfinite(x) and x <= 1e-3 for x in s.gen_span_logprobs):
                    raise LearnerError(f"sample {i}: gen_span_logprobs must be finite log-probabilities (<= 0)")
            elif s.gen_logprobs is None:
                if s.gen_logprob_sum is None:
                    raise LearnerError(f"sample {i}: needs gen_logprobs or gen_logprob_sum")
                if not s.sequence_level:
                    raise LearnerError(f"sample {i}: token-level sample without per-token gen_logprobs "
                                       "(cross-tokenizer samples must set sequence_level=True)")
            else:
                if len(s.gen_logprobs) != len(s.completion_ids):
                    raise LearnerError(f"sample {i}: {len(s.gen_logprobs)} gen_logprobs for "
                                       f"{len(s.completion_ids)} completion tokens")
                if not all(math.isfinite(x) and x <= 1e-4 for x in s.gen_logprobs):
                    raise LearnerError(f"sample {i}: gen_logprobs must be finite log-probabilities (<= 0)")
            if s.gen_logprob_sum is not None and not math.isfinite(s.gen_logprob_sum):
                raise LearnerError(f"sample {i}: gen_logprob_sum is not finite")

    def _token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, entropy: bool = False):
        """log p(target | hidden) per row, computed LOGIT_CHUNK_ROWS rows at a time; with ``entropy``
        also the entropy of each row's next-token distribution (detached; plausibility.py), from the
        same logits, as a pair.

        Only one chunk's [rows, vocab] logits exist at a time, in the forward and in the backward pass
        (``head_logprob``: a frozen head's gradient is computed in the forward, a trained one's logits
        are recomputed in the backward). Computed in fp32 even under autocast.
        """
        head = self._hf_model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        out = [head_logprob(hidden[start:start + LOGIT_CHUNK_ROWS], weight, bias,
                            targets[start:start + LOGIT_CHUNK_ROWS], self.softcap, entropy)
               for start in range(0, hidden.shape[0], LOGIT_CHUNK_ROWS)]
        if entropy:
            return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        return torch.cat(out)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast_dtype is not None)

    def logprobs(self, samples: Sequence[TrainSample]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-completion-token log-probs under the current weights, with grad: ([B, T], mask [B, T]).

        Row b holds sample b's completion tokens left-aligned; T is the longest completion.
        Each distinct prompt is run once (unless ``share_prompts`` is off).
        """
        self._check(samples)
        if not self.share_prompts:
            return self._logprobs_unshared(samples)[:2]
        decoder = self._hf_model.get_decoder()
        states = {}
        with self._autocast():
            for s in samples:
                key = prompt_key(s.prompt_ids)
                if key not in states:
                    states[key] = run_prompt(decoder, s.prompt_ids, self.device)
        return self._logprobs_on_prompts(samples, states)[:2]

    def _logprobs_on_prompts(self, samples: Sequence[TrainSample], states: dict, entropy: bool = False):
        """Log-probs of the completions on top of their prompts' states (``shared_prompt.PromptState``):
        (logp [B, T], mask [B, T], entropy [B, T] or None) — see ``_assemble``.

        Packed (``pack``, packing.py): every completion in rows as wide as the longest, one forward.
        Else rows run in length buckets (``length_buckets``): completions of very different lengths
        are not all padded to the longest one.
        """
        decoder = self._hf_model.get_decoder()
        if self.pack and packable(decoder):
            return self._assemble(samples, [self._packed_logprobs(decoder, samples, states, entropy)])
        order = sorted(range(len(samples)), key=lambda b: len(samples[b].completion_ids))
        parts = []
        for bucket in length_buckets([len(samples[b].completion_ids) for b in order]):
            idx = [order[i] for i in bucket]
            rows = [(states[prompt_key(samples[b].prompt_ids)], samples[b].completion_ids) for b in idx]
            with self._autocast():
                hidden = completion_hidden(decoder, rows, self.device)
            parts.append(self._picked_logprobs([samples[b] for b in idx], idx, hidden, [0] * len(idx), entropy))
        return self._assemble(samples, parts)

    def _packed_logprobs(self, decoder, samples, states: dict, entropy: bool = False):
        """``_picked_logprobs``' part for the whole micro-batch packed in one forward."""
        rows = [(states[prompt_key(s.prompt_ids)], s.completion_ids) for s in samples]
        with self._autocast():
            hidden = packed_hidden(decoder, rows, self.device)      # [sum of completion lengths, hidden]
        targets = torch.tensor([t for s in samples for t in s.completion_ids], device=self.device)
        out = self._token_logprobs(hidden, targets, entropy)
        flat, ent = out if entropy else (out, None)
        out_rows = [b for b, s in enumerate(samples) for _ in s.completion_ids]
        pos = [j for s in samples for j in range(len(s.completion_ids))]
        return flat, out_rows, pos, ent

    def _picked_logprobs(self, samples, rows_out: list[int], hidden: torch.Tensor, first_col: list[int],
                         entropy: bool = False):
        """Log-probs of each completion token of ``samples[i]`` from ``hidden[i, first_col[i] + j]``;
        returns (flat log-probs, their output rows ``rows_out[i]``, their positions j, flat entropies
        or None)."""
        rows, cols, out_rows, pos, targets = [], [], [], [], []
        for i, s in enumerate(samples):
            C = len(s.completion_ids)
            rows += [i] * C
            out_rows += [rows_out[i]] * C
            cols += range(first_col[i], first_col[i] + C)
            pos += range(C)
            targets += s.completion_ids
        dev = self.device
        rows_t, cols_t = torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)
        out = self._token_logprobs(hidden[rows_t, cols_t], torch.tensor(targets, device=dev), entropy)
        flat, ent = out if entropy else (out, None)
        return flat, out_rows, pos, ent

    def _assemble(self, samples, parts):
        """([B, T] log-probs, mask, [B, T] entropies or None) from ``_picked_logprobs`` parts."""
        dev = self.device
        flat = torch.cat([f for f, _, _, _ in parts])
        rows_t = torch.tensor([r for _, rows, _, _ in parts for r in rows], device=dev)
        pos_t = torch.tensor([j for _, _, pos, _ in parts for j in pos], device=dev)
        B, T = len(samples), max(len(s.completion_ids) for s in samples)
        logp = torch.zeros(B, T, device=dev, dtype=flat.dtype).index_put((rows_t, pos_t), flat)
        mask = torch.zeros(B, T, device=dev, dtype=torch.bool)
        mask[rows_t, pos_t] = True
        ent = None
        if parts[0][3] is not None:
            ent = torch.zeros(B, T, device=dev).index_put((rows_t, pos_t), torch.cat([p[3] for p in parts]))
        return logp, mask, ent

    def _logprobs_unshared(self, samples: Sequence[TrainSample], entropy: bool = False):
        """The reference path: every sample a full right-padded prompt + completion sequence
        (returns as ``_assemble``)."""
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
        B, L = len(samples), max(lengths)
        input_ids = torch.zeros(B, L, dtype=torch.long)
        attention = torch.zeros(B, L, dtype=torch.long)
        for b, s in enumerate(samples):
            seq = list(s.prompt_ids) + list(s.completion_ids)
            input_ids[b, :len(seq)] = torch.tensor(seq)
            attention[b, :len(seq)] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        with self._autocast():
            # The decoder alone: the LM head is applied below only at completion positions.
            hidden = self._hf_model.get_decoder()(input_ids=input_ids, attention_mask=attention,
                                                  use_cache=False).last_hidden_state
        # the hidden state before each completion token predicts it
        part = self._picked_logprobs(samples, list(range(B)), hidden, [len(s.prompt_ids) - 1 for s in samples],
                                     entropy)
        return self._assemble(samples, [part])

    # ----------------------------------------------------------------- the step
    def _objective_inputs(self, samples: Sequence[TrainSample], T: int):
        gen = torch.zeros(len(samples), T)
        S = max((len(s.gen_span_logprobs) for s in samples if s.span_ids is not None), default=0)
        span_ids = torch.zeros(len(samples), T, dtype=torch.long)
        gen_span = torch.full((len(samples), max(S, 1)), float("nan"))   # padding: never read
        for b, s in enumerate(samples):
            if s.gen_logprobs is not None:
                gen[b, :len(s.gen_logprobs)] = torch.tensor(s.gen_logprobs, dtype=torch.float32)
            if s.span_ids is not None:
                span_ids[b, :len(s.span_ids)] = torch.tensor(s.span_ids, dtype=torch.long)
                gen_span[b, :len(s.gen_span_logprobs)] = torch.tensor(s.gen_span_logprobs, dtype=torch.float32)
        gen_sum = torch.tensor([s.gen_logprob_sum if s.gen_logprob_sum is not None
                                else float(sum(s.gen_logprobs or s.gen_span_logprobs or []))
                                for s in samples], dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        names = [s.level for s in samples]
        level = names[0] if len(set(names)) == 1 else torch.tensor([LEVELS.index(n) for n in names],
                                                                   device=self.device)
        dev = self.device
        return gen.to(dev), gen_sum.to(dev), adv.to(dev), level, span_ids.to(dev), gen_span.to(dev)

    def compute_gradients(self, samples: Sequence[TrainSample],
                          plausible: plausibility.PlausibilityConfig | None = None, apart=None,
                          **objective_kwargs) -> dict:
        """Forward + backward over the whole batch, micro-batch by micro-batch; leaves the full-batch
        gradient in ``p.grad`` (no optimiser step) and returns the aggregated stats.

        ``objective_kwargs`` go to ``ftis_loss`` (method, C, eps, kl_threshold, normalize, ...); ``level``
        defaults to each sample's own level (``TrainSample.level``: token, sequence or span). With normalize="kept" the micro-batch losses
        are computed over all N and the gradient is rescaled by N / kept once the kept count is known.
        When every advantage is zero nothing is back-propagated (stats["no_signal"] = 1).
        With ``plausible`` set and peer samples in the batch, each sample is scored on its own
        log-probs and entropies of this pass, own micro-batches run first to calibrate the threshold,
        and peer samples below it get weight 0 (plausibility.py; stats["trust/implausible"]).
        With ``apart`` (``foreign_direction.ForeignDirection``) the samples ``apart.key`` names a peer
        for run last, each peer's in micro-batches of its own (no prompt pass shared with others), and
        each peer's gradient joins the step scaled by ``apart.decide`` (stats["trust/direction_kept"]).
        Raises LearnerOOM (gradients cleared) when memory runs out.
        """
        self._check(samples)
        if plausible is not None:   # another tokenizer's text trains at a bounded weight
            samples = _bound_foreign(samples, plausible)
        normalize, level_override = _step_options(objective_kwargs)
        N = len(samples)
        no_signal = all(s.advantage == 0 for s in samples)
        judge = plausible is not None and any(s.source != OWN for s in samples)
        peers: dict[str, list[int]] = {}     # the peers whose gradient ``apart`` bounds: their samples
        if apart is not None and not no_signal:
            for i, s in enumerate(samples):
                peer = apart.key(s)
                if peer is not None:
                    peers.setdefault(peer, []).append(i)
        held = {i for idx in peers.values() for i in idx}
        rest = [i for i in range(N) if i not in held]
        chunks = self._plan(samples, judge, rest)
        apart_chunks = {peer: self._plan(samples, False, idx) for peer, idx in peers.items()}
        total = len(chunks) + sum(len(c) for c in apart_chunks.values())
        run = _GradientRun(N, plausible if judge else None, level_override, objective_kwargs, total)
        uses = Counter(prompt_key(samples[i].prompt_ids) for i in rest)
        live: dict[tuple[int, ...], PromptPass] = {}   # prompts whose samples are not all done yet

        self.optimizer.zero_grad(set_to_none=True)
        try:
            with torch.set_grad_enabled(not no_signal):
                for idx in chunks:
                    self._micro_batch(samples, idx, run, live, uses, backward=not no_signal)
                    if self.on_micro_batch is not None:
                        self.on_micro_batch(len(run.parts), total)
                    for key in [k for k, p in live.items() if p.remaining == 0]:
                        live.pop(key).finish()   # the prompt's gradient: the sum over its samples
                if peers:
                    self._bounded_peers(samples, apart_chunks, run, apart)
        except Exception as err:  # noqa: BLE001 - re-raised typed when it is an OOM
            live.clear()
            self.optimizer.zero_grad(set_to_none=True)
            if _is_oom(err):
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                raise LearnerOOM(self.micro_batch, err) from err
            raise
        return self._step_stats(run, normalize, total, no_signal)

    def _plan(self, samples: Sequence[TrainSample], judge: bool, idx: list[int] | None = None) -> list[list[int]]:
        """The micro-batches (indices into ``samples``, of ``idx`` if given), own-only ones first when
        peers are judged."""
        idx = list(range(len(samples))) if idx is None else idx
        if self.share_prompts:   # each prompt's samples together: its forward serves them all
            chunks = [[idx[j] for j in c] for c in plan_micro_batches(
                [samples[i].prompt_ids for i in idx], [len(samples[i].completion_ids) for i in idx], self.micro_batch)]
        else:                    # sorting by length keeps similar lengths together: less padding
            order = sorted(idx, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids))
            chunks = [order[i:i + self.micro_batch] for i in range(0, len(order), self.micro_batch)]
        if judge:   # own-only micro-batches first: they calibrate the threshold the peers' are judged by
            chunks = sorted(chunks, key=lambda idx: any(samples[i].source != OWN for i in idx))
        return chunks

    def _micro_batch(self, samples, idx: list[int], run: "_GradientRun", live: dict, uses: Counter,
                     backward: bool, shared: bool = True) -> None:
        """Log-probs, the objective and its backward for one micro-batch; its stats go to ``run``.
        ``shared=False``: full prompt + completion rows, no prompt pass shared with other micro-batches."""
        batch = [samples[i] for i in idx]
        judge = run.plausible is not None
        if self.share_prompts and shared:
            logp, mask, ent = self._shared_micro_batch(batch, live, uses, judge)
        else:
            logp, mask, ent = self._logprobs_unshared(batch, judge)
        gen, gen_sum, adv, level, span_ids, gen_span = self._objective_inputs(batch, logp.shape[1])
        if run.level_override is not None:
            level = run.level_override
        weight = None
        if judge:
            weight, run.threshold, judged = self._judge(batch, logp, mask, ent, run.plausible,
                                                        run.own_scores, run.threshold)
        weight = _with_sample_weights(batch, weight, logp.device)
        foreign = torch.tensor([s.foreign for s in batch], device=logp.device)
        loss, st = ftis_loss(logp, gen, adv, mask, level=level, normalize="all", num_samples=run.N,
                             gen_logp_sum=gen_sum, span_ids=span_ids, gen_span_logp=gen_span,
                             sample_weight=weight, foreign=foreign, **run.objective_kwargs)
        if backward:
            loss.backward()
        per_mb = st.pop("per_sample")
        if judge:
            per_mb.update(judged)
        run.add(idx, st, per_mb)

    def _take_grads(self) -> list[torch.Tensor]:
        """The accumulated gradient (zeros where none), leaving ``p.grad`` empty."""
        out = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        for p in self._params:
            p.grad = None
        return out

    def _bounded_peers(self, samples, chunks: dict[str, list[list[int]]], run: "_GradientRun", apart) -> None:
        """Each bounded peer's gradient on its own (its samples in micro-batches of their own, after
        the rest), then the step's gradient = the rest's + each peer's scaled by ``apart.decide``."""
        rest = self._take_grads()
        grads = {}
        for peer, peer_chunks in chunks.items():
            for chunk in peer_chunks:
                self._micro_batch(samples, chunk, run, {}, Counter(), backward=True, shared=False)
                if self.on_micro_batch is not None:
                    self.on_micro_batch(len(run.parts), run.total)
            grads[peer] = self._take_grads()
        scale = apart.decide(rest, grads)
        for j, p in enumerate(self._params):
            p.grad = rest[j] + sum(scale[peer] * g[j] for peer, g in grads.items())
        run.direction = apart.last

    def _step_stats(self, run: "_GradientRun", normalize: str, micro_batches: int, no_signal: bool) -> dict:
        """The full batch's stats from its micro-batches'; with normalize="kept" the gradient is
        rescaled by N / kept here, once the kept count is known."""
        N, per_sample = run.N, run.per_sample
        stats = aggregate_stats(run.parts, per_sample)
        if normalize == "kept":
            scale = N / max(int(stats.get("filter/kept", N)), 1)
            stats["loss"] = stats.get("loss", 0.0) * scale
            for p in self._params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        stats["micro_batches"] = float(micro_batches)
        stats["no_signal"] = 1.0 if no_signal else 0.0
        if run.direction is not None:
            stats["trust/direction_kept"] = run.direction["kept"]
            stats["trust/direction_min_scale"] = run.direction["min_scale"]
        if run.plausible is not None:
            stats["trust/implausible"] = float(per_sample["implausible"].sum())
            stats["trust/repeated_tokens"] = float(per_sample["repeated"].sum())
            stats["trust/threshold"] = run.threshold
        stats["per_sample"] = per_sample
        return stats

    def _judge(self, batch, logp, mask, ent, cfg, own_scores: list, threshold):
        """Plausibility of one micro-batch (plausibility.py): (token weights [b, T], the threshold,
        per-sample tensors). Own rows add to the calibration; the threshold is fixed at the first
        micro-batch holding a peer sample (own-only ones ran before it)."""
        is_peer = torch.tensor([s.source != OWN for s in batch], device=logp.device)
        scores = plausibility.worst_window(plausibility.excess_logp(logp, ent, mask), mask, cfg.window)
        own_scores.append(scores[~is_peer].cpu())
        if threshold is None and bool(is_peer.any()):
            if self.own_score_pool.maxlen != cfg.pool:
                self.own_score_pool = deque(self.own_score_pool, maxlen=cfg.pool)
            self.own_score_pool.extend(float(v) for v in torch.cat(own_scores) if math.isfinite(float(v)))
            threshold = plausibility.calibrate(torch.tensor(list(self.own_score_pool)), cfg,
                                               self.plausibility_threshold)
            self.plausibility_threshold = threshold
        if threshold is None:
            weight = torch.ones(len(batch), device=logp.device)
        else:   # same-tokenizer peers against the own-calibrated threshold; a peer claiming
            # another tokenizer against a fixed one measured on honest text of that kind (another
            # model's honest text is more surprising to us than our own, and the claimant's samples
            # must not be able to loosen it: plausibility.FOREIGN_THRESHOLD)
            same_model = torch.tensor([s.level == "token" for s in batch], device=logp.device)
            weight = plausibility.plausible_weight(scores, is_peer & same_model, threshold)
            if cfg.judge_foreign:
                claimed = is_peer & ~same_model
                weight = torch.where(claimed & (scores < cfg.foreign_threshold), 0.0, weight)
        refused = (weight == 0).cpu()
        # a positive-advantage peer sample trains an unlikely n-gram once (the repeat memory); a
        # re-tokenized one on shorter n-grams: its payload may come in fresh words every time
        tokens = weight[:, None].expand(logp.shape).clone()
        repeated = torch.zeros(len(batch))
        taught = [b for b, s in enumerate(batch) if s.source != OWN and s.advantage > 0 and not bool(refused[b])
                  and (cfg.foreign_memories or s.level == "token")]
        lp, cpu_mask = (logp.detach().float().cpu(), mask.cpu()) if taught else (None, None)
        for b in taught:
            s = batch[b]
            short = cfg.judge_foreign and s.level != "token"
            masked = self.repeat_memory.judge(list(s.completion_ids), lp[b][cpu_mask[b]].tolist(),
                                              cfg.foreign_ngram if short else cfg.ngram,
                                              cfg.foreign_ngram_logp if short else cfg.ngram_logp,
                                              list(s.prompt_ids))
            if short:
                phrase = self.repeat_memory.judge(list(s.completion_ids), [], cfg.foreign_phrase,
                                                  math.inf, list(s.prompt_ids))
                masked = [a or b for a, b in zip(masked, phrase)]
            if any(masked):
                tokens[b, :len(masked)] = torch.tensor([0.0 if m else 1.0 for m in masked])
                repeated[b] = float(sum(masked))
        return tokens, threshold, {"plausibility": scores.cpu(), "implausible": refused, "repeated": repeated}

    def _shared_micro_batch(self, batch, live: dict, uses: Counter, entropy: bool = False):
        """Log-probs of one micro-batch on shared prompt passes (started here when first needed)."""
        decoder = self._hf_model.get_decoder()
        for s in batch:
            key = prompt_key(s.prompt_ids)
            if key not in live:
                with self._autocast():
                    live[key] = PromptPass(decoder, s.prompt_ids, self.device, remaining=uses[key])
            live[key].remaining -= 1
        return self._logprobs_on_prompts(batch, {k: p.leaves for k, p in live.items()}, entropy)

    def step(self, samples: Sequence[TrainSample], plausible: plausibility.PlausibilityConfig | None = None,
             apart=None, **objective_kwargs) -> dict:
        """One optimiser step on the whole batch (``compute_gradients`` + clip + Adam); returns its stats.

        The step is skipped (stats["skipped"] = 1, weights and version unchanged) when the batch has no
        signal: every advantage is zero, or the filter dropped every sample.
        """
        stats = self.compute_gradients(samples, plausible, apart, **objective_kwargs)
        skip = stats["no_signal"] or stats.get("filter/kept", 1.0) == 0 or _all_signal_refused(samples, stats)
        stats["skipped"] = 1.0 if skip else 0.0
        if apart is not None:       # the bounded peers' sums count only what moved the weights
            apart.discard() if skip else apart.commit()
        if skip:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            grads = [p for p in self._params if p.grad is not None]
            if self.grad_clip:
                norm = torch.nn.utils.clip_grad_norm_(grads, self.grad_clip)
            else:
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads]))
            stats["grad_norm"] = float(norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.version += 1
        stats["version"] = float(self.version)
        return stats

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Trainable weights, optimiser state and the version counter (what a checkpoint needs)."""
        return {"trainable": {n: p.detach().cpu().clone() for n, p in self.trainable_state().items()},
                "optimizer": self.optimizer.state_dict(), "version": self.version,
                "mode": self.trainable, "lora": self.lora_config}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (same model, same trainable mode)."""
        if state.get("mode") != self.trainable:
            raise LearnerError(f"checkpoint is for trainable={state.get('mode')!r}, learner is {self.trainable!r}")
        own = self.trainable_state()
        missing = set(own) - set(state["trainable"])
        extra = set(state["trainable"]) - set(own)
        if missing or extra:
            raise LearnerError(f"checkpoint does not match the model: missing {sorted(missing)[:3]}, "
                               f"unexpected {sorted(extra)[:3]}")
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(state["trainable"][n].to(p.device, p.dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:   # the configured lr wins (a resumed run may change it)
            group["lr"] = self.lr
        self.version = int(state["version"])

    def save_adapter(self, directory) -> Path:
        """Write the policy to ``directory``: peft adapter files (LoRA) or a safetensors HF model (full)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        return directory


def _step_options(objective_kwargs: dict) -> tuple[str, object]:
    """Take ``normalize`` and ``level`` out of the caller's objective options (the learner sets the
    per-micro-batch ones itself); (normalize, level override or None)."""
    for key in ("num_samples", "gen_logp_sum", "span_ids", "gen_span_logp"):
        if key in objective_kwargs:
            raise LearnerError(f"{key} is set by the learner, not by the caller")
    normalize = objective_kwargs.pop("normalize", "all")
    if normalize not in ("all", "kept"):
        raise LearnerError(f"normalize must be 'all' or 'kept', got {normalize!r}")
    return normalize, objective_kwargs.pop("level", None)


class _GradientRun:
    """One ``compute_gradients`` call's state across its micro-batches: their stats, per-sample
    values in the caller's order, and the plausibility calibration (own scores, the threshold)."""

    def __init__(self, N: int, plausible, level_override, objective_kwargs: dict, total: int = 0):
        self.N, self.plausible, self.level_override = N, plausible, level_override
        self.total = total        # micro-batches the call runs (progress)
        self.objective_kwargs = objective_kwargs
        self.parts: list[tuple[int, dict]] = []
        self.per_sample: dict[str, torch.Tensor] = {}
        self.own_scores: list[torch.Tensor] = []
        self.threshold = None
        self.direction = None     # ForeignDirection.last, when bounded peers ran

    def add(self, idx: list[int], st: dict, per_mb: dict) -> None:
        for k, v in per_mb.items():   # back to the caller's sample order
            if k not in self.per_sample:
                self.per_sample[k] = torch.zeros(self.N, dtype=v.dtype)
            self.per_sample[k][torch.tensor(idx)] = v.detach().cpu()
        self.parts.append((len(idx), st))


def _bound_foreign(samples: Sequence[TrainSample], cfg: plausibility.PlausibilityConfig) -> list[TrainSample]:
    """``samples`` with each peer sample that claims another tokenizer (sequence or span level)
    weighted by ``plausibility.foreign_factors``; the others as they are."""
    claimed = [s.source != OWN and s.level != "token" for s in samples]
    factors = plausibility.foreign_factors(claimed, cfg)
    return [dataclasses.replace(s, weight=s.weight * f) if f != 1.0 else s for s, f in zip(samples, factors)]


def _with_sample_weights(batch: Sequence[TrainSample], weight: torch.Tensor | None, dev) -> torch.Tensor | None:
    """The plausibility weights (None, or [b, T]) times each sample's own ``weight`` (a masked
    truncated completion's 0, a peer's success weight); None when every factor is 1."""
    if all(s.weight == 1.0 for s in batch):
        return weight
    w = torch.tensor([s.weight for s in batch], dtype=torch.float32, device=dev)
    return w if weight is None else weight * w[:, None]


def _all_signal_refused(samples: Sequence[TrainSample], stats: dict) -> bool:
    """True when every sample with an advantage was judged implausible or carries weight 0
    (a masked truncated completion): nothing left to learn."""
    refused = stats["per_sample"].get("implausible")
    return all((refused is not None and bool(refused[i])) or s.weight == 0
               for i, s in enumerate(samples) if s.advantage != 0)


def _weighted_mean(pairs: list[tuple[float, float]]) -> float:
    """Mean of values weighted by counts, ignoring NaN values (a part with nothing to measure)."""
    pairs = [(w, v) for w, v in pairs if w > 0 and not math.isnan(v)]
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total else float("nan")


def aggregate_stats(parts: list[tuple[int, dict]], per_sample: dict[str, torch.Tensor]) -> dict:
    """Combine per-micro-batch stats into the full batch's, each by the rule registered for it in
    ``metric_keys`` (sums for counts and the loss, max for extrema, token- or sample-weighted means,
    exact fractions of summed counts; sample-level summaries — IS weight mean, ESS, KL mean — are
    recomputed exactly from the per-sample tensors). An unregistered stat raises UnregisteredMetric."""
    out: dict[str, float] = {}
    keys = list(dict.fromkeys(k for _, st in parts for k in st))
    for k in keys:
        rule = metric_keys.rule(k)
        if rule not in metric_keys.MICRO_BATCH_RULES:
            raise LearnerError(f"stat {k!r} is registered as {rule!r}, not as a per-micro-batch stat")
        vals = [(n, st.get("tokens", 0.0), float(st[k])) for n, st in parts if k in st]
        if rule == metric_keys.SUM:
            out[k] = sum(v for _, _, v in vals)
        elif rule == metric_keys.MAX:
            out[k] = max((v for _, _, v in vals if not math.isnan(v)), default=float("nan"))
        elif rule == metric_keys.TOKEN_MEAN:
            out[k] = _weighted_mean([(t, v) for _, t, v in vals])
        elif rule == metric_keys.SPAN_MEAN:
            out[k] = _weighted_mean([(st.get("spans", 0.0), float(st[k])) for _, st in parts if k in st])
        else:     # MEAN; FRACTION and PER_SAMPLE start from it and are made exact below
            out[k] = _weighted_mean([(n, v) for n, _, v in vals])
    N = out.get("samples") or 0.0
    if N:
        for k in keys:
            m = metric_keys.METRICS[k]
            if m.rule == metric_keys.FRACTION and m.of in out:
                out[k] = out[m.of] / N
    if "is_weight" in per_sample and "tokens" in per_sample:
        nonempty = per_sample["tokens"] > 0
        w = per_sample["is_weight"][nonempty].double()
        if w.numel():
            out["sampling/importance_sampling_ratio/mean"] = float(w.mean())
            sq = float((w ** 2).sum())
            out["is/ess"] = float(w.sum() ** 2 / (w.numel() * sq)) if sq > 0 else 0.0
        if "kl" in per_sample and w.numel():
            out["kl/mean"] = float(per_sample["kl"][nonempty].double().mean())
    return out
