"""Backend name -> the class that implements it. Adding a backend is one file and one line here.

A backend class implements base.Generator (usually by subclassing loop.SamplingGenerator) plus
two class-level hooks the callers use: ``create(bundle, GeneratorOptions)`` builds it, and
``adapter_problem(path)`` says why a path is not an adapter it can load (None when it is).
Entries are "module:Class" so that naming the backends (config validation, ``--help``)
imports neither numpy nor an engine.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .base import GenerationError, Generator, GeneratorOptions

BACKENDS: dict[str, str] = {
    "llamacpp": "ftis_edge.generate.llamacpp:LlamaCppGenerator",
    "hf": "ftis_edge.generate.hf:HFGenerator",
}


def backend_class(name: str) -> type:
    """The class registered as ``name``; GenerationError for an unknown name."""
    if name not in BACKENDS:
        raise GenerationError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


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
