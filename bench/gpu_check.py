"""The checks that need a real NVIDIA GPU, as one script (`scripts/gpu_check.sh` runs it).

1. NVML discovery: what `gpuq gpus` shows.
2. VRAM: gpuq's estimate for the bundled model against the memory NVML reports for a
   process that loaded it fully offloaded (the error is printed).
3. One worker pinned to the GPU by UUID, end to end (HTTP, Redis, SQLite), against direct
   llama-cpp-python on the same GPU: tokens/s and their ratio; the jobs must record
   `cuda:<uuid>` as their device.
Exits 2 with a clear message where there is no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gpuq.bundled import BUNDLED_CONTEXT_LENGTH, require_bundled_model_path
from gpuq.gguf_metadata import read_metadata
from gpuq.gpus import nvml_inventory
from gpuq.vram import estimate_vram

_LOAD_AND_REPORT = """
import os, sys, time, json, pynvml, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_gpu_layers=-1, verbose=False)
llm.create_completion("warm up", max_tokens=4)
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByUUID(sys.argv[3])
mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
print(json.dumps({"used_bytes": mine[0].usedGpuMemory if mine else None}))
"""


def measured_vram_mib(uuid: str) -> float | None:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": uuid}
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_REPORT, str(require_bundled_model_path()), str(BUNDLED_CONTEXT_LENGTH), uuid],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    used = json.loads(out.stdout.strip().splitlines()[-1])["used_bytes"]
    return used / 2**20 if used else None


def main() -> int:
    inventory = nvml_inventory(os.uname().nodename)
    if inventory is None:
        print("no NVIDIA GPU visible through NVML: this check needs one (build with CMAKE_ARGS=-DGGML_CUDA=on)")
        return 2
    gpu = inventory.gpus[0]
    print(
        f"GPU 0: {gpu.name} {gpu.uuid} {gpu.memory_total_mib} MiB, CC {gpu.compute_capability}, "
        f"{gpu.temperature_c} C, {gpu.power_w} W"
    )

    estimate = estimate_vram(read_metadata(require_bundled_model_path()).shape, n_ctx=BUNDLED_CONTEXT_LENGTH)
    measured = measured_vram_mib(gpu.uuid)
    print(
        f"VRAM for SmolLM2 at {BUNDLED_CONTEXT_LENGTH} tokens: estimate {estimate.total_mib:.0f} MiB "
        f"(weights {estimate.weights_mib:.0f}, KV {estimate.kv_cache_mib:.0f}, compute {estimate.compute_mib:.0f}, "
        f"overhead {estimate.overhead_mib:.0f}); NVML after load {measured or 'unknown'} MiB"
        + (f"; error {100 * (estimate.total_mib - measured) / measured:+.1f}%" if measured else "")
    )

    from bench import generation
    from bench.__main__ import fresh_system_state

    direct = generation.run_direct(threads=4, max_tokens=128, gpu_layers=-1)
    with fresh_system_state(os.environ.get("GPUQ_REDIS_URL", "redis://127.0.0.1:6379/11"), None) as (r, db, wd):
        ours = generation.run_gpuq(db, r, wd, threads=4, max_tokens=128, gpus=gpu.uuid)
    print(
        f"tokens/s on the GPU: direct {direct.tokens_per_s:.1f}, gpuq worker pinned by UUID "
        f"{ours.tokens_per_s:.1f}, ratio {ours.tokens_per_s / direct.tokens_per_s:.3f}"
    )
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"done in {time.monotonic() - started:.0f} s")
    sys.exit(code)
