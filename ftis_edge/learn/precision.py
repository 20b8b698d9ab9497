"""The learner's arithmetic, decided in one place from (device, train.precision): no torch here.

auto: bf16 autocast on CUDA, fp32 elsewhere; bf16: autocast on the CPU too (docs/benchmarks.md:
0.75x the step's CPU seconds where the CPU has avx512_bf16, per-token log-probs ~0.01 nats off
fp32); fp32: never. The learner autocasts by ``compute_dtype``; fit.py sizes the activations
the backward pass keeps by it; the node says ``slow_note`` at start-up.
"""
from __future__ import annotations

PRECISIONS = ("auto", "fp32", "bf16")


def compute_dtype(device: str, precision: str) -> str:
    """"bf16" or "fp32": what a step on ``device`` ("cpu", "cuda", "mps") computes in."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    # the CPU stays fp32 unless asked: bf16 matmuls are fast only with avx512_bf16 / AMX, and the
    # log-probs move ~0.01 nats per token off the generator's
    return "bf16" if precision == "bf16" or (precision == "auto" and device == "cuda") else "fp32"


def activation_bytes(device: str, precision: str) -> int:
    """Bytes per activation value the backward pass keeps (autocast keeps bf16 ones)."""
    return 2 if compute_dtype(device, precision) == "bf16" else 4


def slow_note(device: str, precision: str, cpu_has_bf16: bool | None) -> str | None:
    """The warning for bf16 asked on a CPU that emulates it (``cpu_has_bf16`` False; None: unknown,
    nothing said); None when the choice is not slower than fp32."""
    if compute_dtype(device, precision) == "bf16" and device == "cpu" and cpu_has_bf16 is False:
        return ("train.precision = \"bf16\" on a CPU without avx512_bf16 / AMX: its bf16 matmuls are "
                "emulated and slower than fp32; set it to \"auto\"")
    return None
