"""Which device this worker runs on, decided once at start.

The launcher (the supervisor, or ``gpuq worker --gpus``) sets ``CUDA_VISIBLE_DEVICES``
to GPU UUIDs before anything imports llama.cpp, so inside the worker CUDA device 0 is
always its own GPU and indices never disagree with NVML.

A worker pinned to a *simulated* GPU (UUID ``GPU-SIM-...``) runs llama.cpp on the CPU
and says so on every job it records: ``simulated:<uuid>``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from gpuq.fleet.gpus import SIMULATED_UUID_PREFIX

CPU = "cpu"
ALL_LAYERS = -1


@dataclass(frozen=True, slots=True)
class Device:
    label: str  # "cpu", "cuda:<uuid>[,<uuid>]" or "simulated:<uuid>[,<uuid>]", recorded on every job row
    gpu_layers: int
    gpu_uuids: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        """Running on a real CUDA device (not the CPU, not a simulated GPU)."""
        return self.label.startswith("cuda:")


def pin_to_gpus(gpu_uuids: list[str]) -> None:
    """Set the CUDA environment for this process. Must run before llama.cpp is imported."""
    if "llama_cpp" in sys.modules:
        raise RuntimeError("llama_cpp was imported before the worker was pinned to its GPUs")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)


def pinned_gpus() -> tuple[str, ...]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(u for u in visible.split(",") if u and u != "-1")


def detect_device() -> Device:
    import llama_cpp

    uuids = pinned_gpus()
    if uuids and all(u.startswith(SIMULATED_UUID_PREFIX) for u in uuids):
        return Device(label=f"simulated:{','.join(uuids)}", gpu_layers=0, gpu_uuids=uuids)
    if uuids and llama_cpp.llama_supports_gpu_offload():
        return Device(label=f"cuda:{','.join(uuids)}", gpu_layers=ALL_LAYERS, gpu_uuids=uuids)
    return Device(label=CPU, gpu_layers=0)
