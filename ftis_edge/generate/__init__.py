"""Generation backends (llama.cpp, HF transformers) behind one interface: see base.py.

loop.py holds the sampling loop they share; registry.py maps backend names to them.
"""
from .base import Completion, GenerationError, Generator, GeneratorOptions, SamplerSettings

__all__ = ["Completion", "GenerationError", "Generator", "GeneratorOptions", "SamplerSettings"]
