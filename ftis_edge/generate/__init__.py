"""Generation backends (llama.cpp, HF transformers) behind one interface: see base.py."""
from .base import Completion, Generator, SamplerSettings

__all__ = ["Completion", "Generator", "SamplerSettings"]
