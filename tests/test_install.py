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


# --- the shared cache: two installs at once, and a failed step ---------------------------------
# FTIS_PYTHON is a stand-in python: `-m venv` makes a venv of itself, `-m pip` fakes download /
# wheel (a 1 s "build", logged) / install, `-c` checks answer "not installed" for llama_cpp, and
# the lock's `-c` goes to the real interpreter. install.sh and pyproject.toml are copied into
# two folders (two checkouts) that share one FTIS_CACHE; llama.cpp is never built.
FAKE_PY = r"""set -e
case "$1" in
  -m) shift; mod="$1"; shift ;;
  -c) case "$2" in *fcntl*) exec "$REAL_PY" "$@" ;; *llama_cpp*) exit 1 ;; *) exit 0 ;; esac ;;
  -) cat >/dev/null; echo "[install] ok (stand-in python)"; exit 0 ;;
  *) exit 0 ;;
esac
if [ "$mod" = venv ]; then mkdir -p "$1/bin"; ln -sf "$0" "$1/bin/python"; exit 0; fi
[ "$mod" = pip ] || exit 0
cmd=""; dir=""; prev=""
for a in "$@"; do
  case "$a" in download|wheel|install) [ -z "$cmd" ] && cmd="$a" ;; esac
  case "$prev" in -d|-w) dir="$a" ;; esac
  prev="$a"
done
echo "$cmd $$" >> "$FAKE_LOG"
if [ "$cmd" = download ]; then
  src="$dir/llama_cpp_python-0.3.36/vendor/llama.cpp"
  mkdir -p "$src/conversion" "$src/gguf-py"
  touch "$src/convert_hf_to_gguf.py" "$src/LICENSE"
  tar czf "$dir/llama_cpp_python-0.3.36.tar.gz" -C "$dir" llama_cpp_python-0.3.36
  rm -rf "$dir/llama_cpp_python-0.3.36"
elif [ "$cmd" = wheel ]; then
  sleep 1                                       # the build: long enough for the two to overlap
  [ -n "${FAKE_BUILD:-}" ] && exit 0            # "built", yet wrote no wheel (the old silent failure)
  echo wheel > "$dir/llama_cpp_python-0.3.36-py3-none-any.whl"
fi
exit 0
"""


def checkout(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for f in ("install.sh", "pyproject.toml"):
        (folder / f).write_text((Path(ROOT) / f).read_text())
    return folder


def install_env(tmp_path: Path, **extra: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake(bin_dir, "python3", FAKE_PY)
    for tool in ("cc", "c++", "cmake"):
        fake(bin_dir, tool, "exit 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTIS_")}
    return {**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "FTIS_PYTHON": str(bin_dir / "python3"), "FTIS_CUDA": "0",
            "FTIS_CACHE": str(tmp_path / "cache"), "REAL_PY": sys.executable, "FAKE_LOG": str(tmp_path / "log"),
            **extra}


def test_two_installs_at_once_share_the_cache_and_build_once(tmp_path):
    env = install_env(tmp_path)
    procs = [subprocess.Popen(["bash", str(checkout(tmp_path, n) / "install.sh")], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in ("a", "b")]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and "done in" in out and "error" not in out, out
    assert sum("waiting for it" in out for out in outs) == 1, outs     # the second one waited
    assert sum("using cached wheel" in out for out in outs) == 1, outs  # ... and found the first's wheel
    log = (tmp_path / "log").read_text().split()
    assert log.count("wheel") == 1 and log.count("download") == 1, log
    cache = tmp_path / "cache"
    wheels = list((cache / "wheels").iterdir())
    assert len(wheels) == 1 and [w.name for w in wheels[0].iterdir()] == ["llama_cpp_python-0.3.36-py3-none-any.whl"]
    assert sorted(p.name for p in cache.iterdir()) == [".lock", "llama.cpp-convert-0.3.36", "sdist", "wheels"]
    assert list((cache / "sdist").iterdir()) == []                    # no temp dir, no sdist left
    assert (cache / "llama.cpp-convert-0.3.36" / "convert_hf_to_gguf.py").is_file()


def test_a_failed_step_fails_the_install_and_never_says_done(tmp_path):
    r = subprocess.run(["bash", str(checkout(tmp_path, "a") / "install.sh")], env=install_env(tmp_path, FAKE_BUILD="empty"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "done" not in r.stdout, r.stdout
    assert "the llama-cpp-python build wrote no wheel into" in r.stderr, r.stderr
    assert not (tmp_path / "a" / ".venv" / ".ftis-install-stamp").exists()
