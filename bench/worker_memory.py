"""Worker memory on the CPU, for sizing: the resident set (VmRSS) of a real ``gpuq worker``
process idle, then with the bundled model's generation context loaded (K sequences of the
model's 2,048-token context: ``GPUQ_WORKER_SLOTS``), then with its embedding context too.
On a GPU the weights and KV cache live in VRAM instead, where gpuq/fleet/vram.py's estimate
(checked against llama.cpp's own allocation, docs/architecture.md) is what placement uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.system import fresh_system_state
from gpuq.testing import GpuqProcesses

MODEL = "smollm2-135m"


@dataclass
class WorkerMemory:
    slots: int
    idle_mib: float
    generate_mib: float
    generate_and_embed_mib: float


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def measure(redis_url: str, slots: int) -> WorkerMemory:
    with fresh_system_state(redis_url, None) as (redis, database_url, workdir):
        processes = GpuqProcesses(database_url, redis, workdir, settings={"GPUQ_WORKER_SLOTS": str(slots)})
        try:
            _api, url = processes.start_api()
            worker, _name = processes.start_worker()
            idle = rss_mib(worker.popen.pid)
            with processes.client(url) as client:
                job = {"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0}
                client.wait(client.submit(job)["id"], timeout_s=120)
                generate = rss_mib(worker.popen.pid)
                client.wait(client.submit({"kind": "embed", "model": MODEL, "input": "hi"})["id"], timeout_s=120)
                both = rss_mib(worker.popen.pid)
        finally:
            processes.stop_all()
    return WorkerMemory(slots, idle, generate, both)


def run(redis_url: str, slot_counts: list[int]) -> str:
    rows = [measure(redis_url, k) for k in slot_counts]
    lines = [
        f"worker memory (VmRSS, MiB) on the CPU, {MODEL} (Q4_1, 2,048-token context)",
        f"  {'K':>3} {'idle':>8} {'+ generation context':>22} {'+ embedding context':>21}",
    ]
    for r in rows:
        lines.append(f"  {r.slots:>3} {r.idle_mib:8.0f} {r.generate_mib:22.0f} {r.generate_and_embed_mib:21.0f}")
    return "\n".join(lines)
