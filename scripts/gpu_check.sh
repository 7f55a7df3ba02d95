#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and driver. Prints one table
# (bench/gpu_check.py: CUDA build, NVML discovery, the VRAM estimate against NVML after a
# load, a pinned worker's tokens/s against direct llama-cpp-python, continuous batching at
# K=8, energy per job against NVML power x time, GPU telemetry, seeded texts across K and
# cache hits, gpuq against llama-server on W1-W3, an intake burst, a start restored from the
# prefix cache's RAM and disk against its prefill, and parked sequences' texts against never
# parked) and exits non-zero on any miss: 1 for a miss, 2 when no GPU is visible.
#
#   scripts/gpu_check.sh                 the real run (needs the GPU)
#   scripts/gpu_check.sh --cpu-dry-run   the table and exit code on canned figures, any machine
#                                        (add --miss vram|worker|... to see a miss)
#
# The real run installs gpuq into a clean venv (.venv-gpu-check, removed first) with
# scripts/install.sh, which finds the GPU through nvidia-smi and builds the CUDA wheel for
# its architecture (-DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=<the GPU's>). When the CPU
# wheel is already cached it is installed first, so the CUDA one must replace it (the forced
# reinstall of a same-version wheel). Building the CUDA wheel takes 5-10 minutes on 16 cores,
# once (~/.cache/gpuq-wheels). Without PyPI, point pip at a wheel folder: PIP_NO_INDEX=1
# PIP_FIND_LINKS=/path/to/wheels (it needs llama-cpp-python's sdist and its build tools too).
# Needs Redis: GPUQ_REDIS_URL, or redis-server on the PATH (a private one is started).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--cpu-dry-run" ]; then
  exec "${GPU_CHECK_PYTHON:-.venv/bin/python}" -m bench.gpu_check "$@"
fi
if [ $# -gt 0 ]; then
  echo "gpu_check.sh: unknown option $1 (known: --cpu-dry-run [--miss CHECK])" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check.sh: no NVIDIA GPU answers nvidia-smi here; run it on a GPU host (or use --cpu-dry-run)" >&2
  exit 2
fi

VENV=.venv-gpu-check
rm -rf "$VENV"
CPU_PLAN=$(CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
  ./scripts/install.sh --venv "$VENV" --print-plan)
CPU_WHEELHOUSE=$(printf '%s\n' "$CPU_PLAN" | sed -n 's/^wheelhouse=//p')
if ls "$CPU_WHEELHOUSE"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "== a CPU build first (cached), for the CUDA build to replace" >&2
  CMAKE_ARGS="$(printf '%s\n' "$CPU_PLAN" | sed -n 's/^CMAKE_ARGS=//p')" ./scripts/install.sh --venv "$VENV"
fi
echo "== the CUDA build: $(./scripts/install.sh --venv "$VENV" --print-plan | sed -n 's/^CMAKE_ARGS=//p')" >&2
./scripts/install.sh --venv "$VENV"

if [ -z "${GPUQ_REDIS_URL:-}" ]; then
  port=$("$VENV/bin/python" -c 'from gpuq.local.redis_server import free_port; print(free_port())')
  redis-server --port "$port" --save "" --appendonly no --daemonize yes
  export GPUQ_REDIS_URL="redis://127.0.0.1:$port/11"
  trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
fi
"$VENV/bin/python" -m bench.gpu_check
