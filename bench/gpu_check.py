"""The checks that need a real NVIDIA GPU, as one script (`scripts/gpu_check.sh` runs it).

1. NVML discovery: what `gpuq gpus` shows.
2. VRAM: gpuq's estimate for the bundled model against the memory NVML reports for a
   process that loaded it fully offloaded (the error is printed).
3. One worker pinned to the GPU by UUID, end to end (HTTP, Redis, SQLite), against direct
   llama-cpp-python on the same GPU: tokens/s and their ratio; the jobs must record
   `cuda:<uuid>` as their device.
4. Energy per job: a worker pinned to the GPU runs a long generation; the job's `energy_j`
   must be > 0 and within a factor of two of NVML's power (sampled here meanwhile) times its
   `gpu_seconds`, and `/metrics` must show the GPU's power and utilisation gauges.
Exits 2 with a clear message where there is no GPU, 1 when the energy check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuq.fleet.gpus import nvml_inventory
from gpuq.fleet.vram import estimate_vram
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, require_bundled_model_path
from gpuq.registry.gguf import read_metadata

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
    batching_ok = check_batching(gpu.uuid)
    return 0 if check_energy(gpu.uuid) and batching_ok else 1


def check_batching(uuid: str, slots: int = 8) -> bool:
    """Continuous batching on the GPU: gpuq at K against the direct batched ceiling and K=1."""
    from bench import batching
    from bench.__main__ import fresh_system_state

    redis_url = os.environ.get("GPUQ_REDIS_URL", "redis://127.0.0.1:6379/11")
    direct = batching.run_direct_batched(slots=slots, threads=4, max_tokens=64, gpu_layers=-1)
    ours = {}
    for k in (1, slots):
        with fresh_system_state(redis_url, None) as (r, db, wd):
            ours[k] = batching.run_gpuq(db, r, wd, slots=k, threads=4, max_tokens=64, gpus=uuid)
    ceiling, scaling = ours[slots].tokens_per_s / direct.tokens_per_s, ours[slots].tokens_per_s / ours[1].tokens_per_s
    print(
        f"continuous batching on the GPU, {len(batching.PROMPTS)} jobs: direct batched K={slots} "
        f"{direct.tokens_per_s:.1f} tok/s, gpuq K={slots} {ours[slots].tokens_per_s:.1f}, gpuq K=1 "
        f"{ours[1].tokens_per_s:.1f}; gpuq/direct {ceiling:.2f}x (target >= 0.9x), K={slots}/K=1 {scaling:.2f}x"
    )
    return ceiling >= 0.9


class PowerWatch:
    """NVML power of one GPU, sampled every 0.1 s by this script (independently of gpuq)."""

    def __init__(self, uuid: str) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self.readings: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.1):
            self.readings.append((time.time(), self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000))

    def mean_watts(self, start: float, end: float) -> float | None:
        inside = [w for t, w in self.readings if start <= t <= end]
        return sum(inside) / len(inside) if inside else None

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def check_energy(uuid: str) -> bool:
    import httpx

    from gpuq import store
    from gpuq.db import migrate
    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.registry.models import register_bundled_model
    from gpuq.testing import GpuqProcesses

    redis_url = os.environ.get("GPUQ_REDIS_URL", "redis://127.0.0.1:6379/11")
    with tempfile.TemporaryDirectory(prefix="gpuq-energy-") as tmp:
        workdir = Path(tmp)
        (workdir / "models").mkdir()
        database_url = f"sqlite:///{workdir / 'gpuq.db'}"
        migrate.upgrade(database_url)
        engine = sync_engine(database_url)
        with sync_sessions(engine)() as session:
            register_bundled_model(session)
        engine.dispose()
        processes = GpuqProcesses(database_url, redis_url, workdir)
        watch = PowerWatch(uuid)
        try:
            _api, url = processes.start_api()
            # The supervisor (NVML discovery, one worker pinned per GPU, telemetry to Redis and SQL).
            processes.start_supervisor(expected_workers=len(nvml_inventory(os.uname().nodename).gpus))
            body = {"kind": "generate", "model": "smollm2-135m", "prompt": "Tell a long story.", "max_tokens": 1800}
            with processes.client(url) as client:
                ids = [client.submit(body | {"seed": i, "temperature": 0.8})["id"] for i in range(3)]
                jobs = [client.wait(i, timeout_s=300) for i in ids]
            scrape = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}).text
            engine = sync_engine(database_url)
            with sync_sessions(engine)() as session:
                history = store.gpu_samples(session, gpu_uuid=uuid)
            engine.dispose()
        finally:
            watch.stop()
            processes.stop_all()
    ok = True
    for job in jobs:
        start = _epoch(job["started_at"])
        end = _epoch(job["finished_at"])
        watts = watch.mean_watts(start, end)
        expected = watts * job["gpu_seconds"] if watts and job["gpu_seconds"] else None
        energy = job["energy_j"]
        plausible = bool(energy and energy > 0 and expected and 0.5 <= energy / expected <= 2.0)
        ok &= plausible and job["device"] == f"cuda:{uuid}"
        print(
            f"energy of {job['id']} ({job['completion_tokens']} tokens, {job['device']}): {energy} J over "
            f"{job['gpu_seconds']} GPU-s; NVML mean power then {watts} W -> expected ~{expected} J: "
            + ("plausible" if plausible else "IMPLAUSIBLE")
        )
    gauges = [line for line in scrape.splitlines() if line.startswith(("gpuq_gpu_power_watts", "gpuq_gpu_utilization"))]
    print("metrics:", *gauges, sep="\n  ")
    ok &= bool(gauges)
    last = history[-1] if history else None
    print(
        f"gpu_samples rows for the GPU: {len(history)}"
        + (f"; last: {last.utilization_pct}% busy, {last.memory_used_mib} MiB, {last.power_w} W" if last else "")
    )
    ok &= bool(history) and history[-1].power_w is not None
    print("energy check:", "PASS" if ok else "FAIL")
    return ok


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"done in {time.monotonic() - started:.0f} s")
    sys.exit(code)
