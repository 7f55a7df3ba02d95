"""Which device this worker runs on, decided once at start.

The launcher (``gpuq worker --gpus`` now, the supervisor later) sets
``CUDA_VISIBLE_DEVICES`` to GPU UUIDs before anything imports llama.cpp, so inside the
worker CUDA device 0 is always its own GPU and indices never disagree with NVML.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

CPU = "cpu"
ALL_LAYERS = -1


@dataclass(frozen=True, slots=True)
class Device:
    label: str  # "cpu" or "cuda:<uuid>[,<uuid>...]", recorded on every job row
    gpu_layers: int


def pin_to_gpus(gpu_uuids: list[str]) -> None:
    """Set the CUDA environment for this process. Must run before llama.cpp is imported."""
    if "llama_cpp" in sys.modules:
        raise RuntimeError("llama_cpp was imported before the worker was pinned to its GPUs")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)


def detect_device() -> Device:
    import llama_cpp

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible and visible != "-1" and llama_cpp.llama_supports_gpu_offload():
        return Device(label=f"cuda:{visible}", gpu_layers=ALL_LAYERS)
    return Device(label=CPU, gpu_layers=0)
