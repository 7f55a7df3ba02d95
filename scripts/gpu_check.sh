#!/usr/bin/env bash
# The GPU checks of the fleet issue, for a machine with an NVIDIA GPU: builds
# llama-cpp-python with CUDA, then runs bench/gpu_check.py (NVML discovery, VRAM estimate
# against NVML after load, a pinned worker's tokens/s against direct llama-cpp-python, and
# a job's energy_j against NVML power x time, /metrics GPU gauges, gpu_samples rows).
# Needs Redis: GPUQ_REDIS_URL, or redis-server on the PATH (a private one is started).
set -euo pipefail
cd "$(dirname "$0")/.."
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_CUDA=on}" ./scripts/install.sh
if [ -z "${GPUQ_REDIS_URL:-}" ]; then
  port=$(.venv/bin/python -c 'from gpuq.local.redis_server import free_port; print(free_port())')
  redis-server --port "$port" --save "" --appendonly no --daemonize yes
  export GPUQ_REDIS_URL="redis://127.0.0.1:$port/11"
  trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
fi
.venv/bin/python -m bench.gpu_check
