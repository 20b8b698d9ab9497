"""Which machine a run ran on, for its start record: CPU model, cores, boot id.

CPU-seconds and even the floats of one update differ between two machines (docs/results.md: an
isolated twin rerun on another VM took 1.3x fewer CPU-seconds and drifted from round 1 on). A
comparison of runs is only clean when they ran on the same machine in the same boot, so every
start (and every resume) records it, and a cross-machine confound shows in the metrics at once.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")     # Linux: new at every boot
CPUINFO = Path("/proc/cpuinfo")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13"), from /proc/cpuinfo where there is one."""
    for line in (_read(CPUINFO) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_has_bf16() -> bool | None:
    """Whether the CPU multiplies bf16 natively (avx512_bf16 or AMX; None: /proc/cpuinfo unreadable).
    Without it a bf16 learner emulates and runs slower than fp32."""
    text = _read(CPUINFO)
    if text is None:
        return None
    flags = next((line.partition(":")[2].split() for line in text.splitlines()
                  if line.partition(":")[0].strip() in ("flags", "Features")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def usable_cores() -> int:
    """Cores this process may run on (a container or taskset can give fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe() -> dict:
    """The machine, as the start record keeps it."""
    boot = _read(BOOT_ID)
    return {"host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count() or 1,
            "usable_cores": usable_cores(), "boot_id": boot.strip() if boot else None,
            "os": f"{platform.system()} {platform.release()}"}
