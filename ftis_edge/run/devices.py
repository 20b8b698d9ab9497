"""Which device the learner trains on, and which generator engine ``model.backend = "auto"`` means.

auto: CUDA when torch sees a GPU, else Apple's MPS (Apple Silicon), else the CPU. The engine:
llama.cpp, unless the learner is on a GPU that this llama.cpp build cannot use (a CPU-only
build — what ``./install.sh`` makes on a PC with the NVIDIA driver but no CUDA toolkit):
then HF transformers generates on the GPU, far faster than llama.cpp on the CPU.
"""
from __future__ import annotations

from dataclasses import replace

from ..config import Config, ConfigError
from ..generate.registry import pick_auto


def _mps_available(torch) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def pick_device(requested: str = "auto") -> str:
    """"cuda" | "mps" | "cpu" for ``model.device``; ConfigError when the one asked for is absent."""
    import torch
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available(torch) else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device: cuda, but torch sees no CUDA GPU (a CPU-only torch, or no driver); "
                          "use \"auto\" or \"cpu\"")
    if requested == "mps" and not _mps_available(torch):
        raise ConfigError("model.device: mps needs Apple Silicon and a torch built with MPS; use \"auto\" or \"cpu\"")
    return requested


def pick_backend(requested: str, device: str) -> tuple[str, str | None]:
    """(backend, why) for ``model.backend``; ``why`` is a sentence when "auto" chose another engine
    than the default (registry.pick_auto: each backend class says whether it can use the GPU)."""
    if requested != "auto":
        return requested, None
    return pick_auto(device)


def resolve_engines(cfg: Config, say=None) -> Config:
    """model.device / model.backend "auto" → what this machine has; ``say`` gets the one line
    that says why when auto picks another engine than the default."""
    device = pick_device(cfg.model.device)
    backend, why = pick_backend(cfg.model.backend, device)
    if why and say is not None:
        say("%s", why)
    return replace(cfg, model=replace(cfg.model, device=device, backend=backend))
