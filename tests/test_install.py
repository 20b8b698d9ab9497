"""install.sh's flavour detection on machines we do not have: fake `nvidia-smi`, `nvcc` and
`uname` first on PATH, `./install.sh --print-flavour` (which changes nothing)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from procs import ROOT


def fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def flavour(tmp_path: Path, **fakes: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in fakes.items():
        fake(bin_dir, name, script)
    env = {k: v for k, v in os.environ.items() if k not in ("FTIS_CUDA", "FTIS_CUDA_ARCHS", "FTIS_TORCH_SPEC")}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", FTIS_PYTHON=sys.executable, CUDA_HOME=str(tmp_path / "no-cuda"))
    r = subprocess.run(["bash", str(Path(ROOT) / "install.sh"), "--print-flavour"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line and not line.startswith("\x1b"))
    out["said"] = next(line for line in r.stdout.splitlines() if "flavour:" in line)
    return out


NVIDIA_SMI = """case "$*" in
  -L) echo "GPU 0: NVIDIA GeForce RTX 3060"; echo "GPU 1: NVIDIA GeForce RTX 4090" ;;
  *compute_cap*) printf '8.6\\n8.9\\n8.6\\n' ;;
esac
"""


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(Path(ROOT) / "install.sh")]).returncode == 0


def test_no_gpu_is_the_portable_cpu_build(tmp_path):
    f = flavour(tmp_path, uname='case "$1" in -s) echo Linux ;; *) echo x86_64 ;; esac\n')
    assert f["FLAVOUR"] == "cpu" and "GGML_CUDA" not in f["CMAKE_FLAGS"] and "GGML_NATIVE=OFF" in f["CMAKE_FLAGS"]


def test_nvidia_driver_without_toolkit_builds_llamacpp_for_the_cpu_and_says_so(tmp_path):
    f = flavour(tmp_path, uname='case "$1" in -s) echo Linux ;; *) echo x86_64 ;; esac\n', **{"nvidia-smi": NVIDIA_SMI})
    assert f["FLAVOUR"] == "cuda-driver"
    assert "GGML_CUDA" not in f["CMAKE_FLAGS"] and f["TORCH_SPEC"] == "torch==2.13.0"
    assert "no nvcc" in f["said"] and "HF on the GPU" in f["said"]


def test_nvidia_with_toolkit_builds_for_the_installed_architectures_only(tmp_path):
    f = flavour(tmp_path, uname='case "$1" in -s) echo Linux ;; *) echo x86_64 ;; esac\n',
                nvcc="echo 'Cuda compilation tools, release 12.4'\n", **{"nvidia-smi": NVIDIA_SMI})
    assert f["FLAVOUR"] == "cuda"
    assert "-DGGML_CUDA=on" in f["CMAKE_FLAGS"] and "-DCMAKE_CUDA_ARCHITECTURES=86;89 " in f["CMAKE_FLAGS"]


def test_apple_silicon_is_metal(tmp_path):
    f = flavour(tmp_path, uname='case "$1" in -s) echo Darwin ;; *) echo arm64 ;; esac\n',
                **{"nvidia-smi": NVIDIA_SMI})
    assert f["FLAVOUR"] == "metal" and "-DGGML_METAL=on" in f["CMAKE_FLAGS"] and "MPS" in f["said"]
