"""Start-up cross-checks between the config and the resolved model: fail in one line before
minutes of loading, not in round 1 (or in the GGUF writer after the first optimiser step).

Each check raises ``ConfigError`` naming the key to change. ``model.backend`` is resolved
before these run; an unresolved "auto" is read as the registry's default. What a backend needs
(a GGUF file, LoRA layers it can load, a context limit) its class says (generate/registry.py).
They need only the model's metadata and its tokenizer (cached after the first load), never its weights.
"""
from __future__ import annotations

import logging

from ..config import Config, ConfigError
from ..generate.registry import backend_class, resolve

log = logging.getLogger("ftis_edge.run.preflight")

# Linear layers of the decoder blocks of the architectures ftis-edge converts and syncs
# (llama.cpp arch names; HF's are the same words). The GGUF LoRA writer knows exactly these.
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KNOWN_ARCHS = ("llama", "gemma3", "gemma2", "gemma", "mistral", "qwen2", "qwen3")


def backend_of(cfg: Config):
    """The class of the configured generator backend (its facts: base.GeneratorBackend)."""
    return backend_class(resolve(cfg.model.backend))


def check_backend(cfg: Config, bundle) -> None:
    problem = backend_of(cfg).model_problem(bundle)
    if problem:
        raise ConfigError(f"model.backend: {cfg.model.spec!r} {problem}")


def check_lora_targets(cfg: Config, bundle) -> None:
    if cfg.train.trainable != "lora":
        return
    targets = list(cfg.train.lora_targets)
    if not targets:
        raise ConfigError("train.lora_targets: empty; name at least one of " + ", ".join(DECODER_LINEARS))
    unknown = [t for t in targets if t not in DECODER_LINEARS]
    if not unknown:
        return
    problem = backend_of(cfg).lora_problem(targets)
    if problem:
        raise ConfigError(f"train.lora_targets: {problem}")
    if bundle.arch in KNOWN_ARCHS:
        raise ConfigError(f"train.lora_targets: {bundle.arch} has no {', '.join(map(repr, unknown))} layer; "
                          f"its decoder linears are {', '.join(DECODER_LINEARS)}")


def longest_first_prompt(cfg: Config, bundle, task) -> int:
    """Tokens of the longest prompt of the first round (system prompt and worked examples included)."""
    stream = task.prompts(seed=cfg.node.seed, start=0)
    return max(len(bundle.encode(bundle.render_prompt(task.messages(next(stream).question))))
               for _ in range(cfg.task.prompts_per_round))


def check_lengths(cfg: Config, bundle, task) -> None:
    """The longest prompt of the first round + max_new_tokens must fit the generator's context."""
    limits = []
    fixed = backend_of(cfg).context_limit
    if fixed:
        limits.append((fixed, f"the {resolve(cfg.model.backend)} context"))
    if bundle.n_ctx_train:
        limits.append((int(bundle.n_ctx_train), "the model's trained context"))
    if not limits:
        return
    limit, what = min(limits)
    prompt = longest_first_prompt(cfg, bundle, task)
    if prompt + cfg.task.max_completion_length > limit:
        raise ConfigError(f"task.max_completion_length: {cfg.task.max_completion_length} new tokens after a {prompt}-token "
                          f"prompt exceed {what} of {limit} tokens per sequence; use at most "
                          f"{max(limit - prompt, 0)}" + (" (or fewer task.few_shot examples)"
                                                         if cfg.task.few_shot else ""))


def check_fit(cfg: Config, bundle, task) -> tuple[bool, str]:
    """Will it fit (fit.py)? Said in one line before loading: info when it fits, a warning naming
    what dominates and what to change when it does not fit in the memory free now (an estimate:
    the node still starts), and a refusal (ConfigError) when it needs more than the machine has."""
    from ..learn import fit
    setup = fit.Setup.from_config(cfg, prompt_tokens=longest_first_prompt(cfg, bundle, task))
    shape, have = fit.shape_of(bundle, cfg.model_label), fit.machine(setup.device)
    ok, line = fit.check(shape, setup, have)
    refusal = None if ok else fit.impossible(shape, setup, have)
    if refusal:
        raise ConfigError(f"memory: {refusal}")
    (log.info if ok else log.warning)("memory: %s", line)
    return ok, line


def check(cfg: Config, bundle, task) -> None:
    """Every start-up cross-check, cheapest first."""
    check_backend(cfg, bundle)
    check_lora_targets(cfg, bundle)
    check_lengths(cfg, bundle, task)
    check_fit(cfg, bundle, task)
