"""Backend name -> the class that implements it. Adding a backend is one file and one line here.

A backend class implements base.Generator (usually by subclassing loop.SamplingGenerator) plus
base.GeneratorBackend's class-level part: ``create(bundle, GeneratorOptions)`` builds it,
``adapter_problem(path)`` says why a path is not an adapter it can load, and the facts the rest
of the package asks (preflight, fit, evaluate, the device pick: whether it needs a GGUF file,
which LoRA layers reach it, its memory, whether it can use the learner's GPU). Nothing outside
generate/ compares a backend's name (tests/test_backend_facts.py). Entries are "module:Class"
so that naming the backends (config validation, ``--help``) imports neither numpy nor an engine.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .base import GenerationError, Generator, GeneratorOptions

BACKENDS: dict[str, str] = {
    "llamacpp": "ftis_edge.generate.llamacpp:LlamaCppGenerator",
    "hf": "ftis_edge.generate.hf:HFGenerator",
}
DEFAULT = "llamacpp"      # what model.backend = "auto" means unless it cannot use the learner's GPU


def backend_class(name: str) -> type:
    """The class registered as ``name``; GenerationError for an unknown name."""
    if name not in BACKENDS:
        raise GenerationError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def resolve(name: str) -> str:
    """A configured backend name, "auto" read as the default (before the device is known)."""
    return DEFAULT if name == "auto" else name


def pick_auto(device: str) -> tuple[str, str | None]:
    """(backend, why) for model.backend = "auto" with the learner on ``device``: the default, or
    else the first backend that can use that GPU (``why`` says so in one sentence)."""
    problem = backend_class(DEFAULT).gpu_problem(device)
    if problem is None:
        return DEFAULT, None
    other = next((n for n in BACKENDS if backend_class(n).gpu_problem(device) is None), DEFAULT)
    return other, f"model.backend auto: {other} — the learner is on {device} and {problem}"


def create_generator(name: str, bundle, options: GeneratorOptions = GeneratorOptions()) -> Generator:
    """Build the ``name`` backend on a ``models.ModelBundle``, ending sequences where the bundle's
    prompt format ends a turn (``ModelBundle.stop_texts``)."""
    gen = backend_class(name).create(bundle, options)
    texts = getattr(bundle, "stop_texts", ())
    if texts:
        gen.set_stop_texts(texts, bundle.tokenizer())
    return gen


def adapter_problem(name: str, path) -> str | None:
    """Why ``path`` cannot be loaded as an adapter by the ``name`` backend, or None."""
    return backend_class(name).adapter_problem(Path(path).expanduser())
