"""This worker's GPUs' memory as NVML reads it now, for the decisions gpuq's estimates
alone cannot make: does a model fit beside what others hold (other processes, sibling
workers of ``--slots-per-gpu``, a group worker sharing the GPUs), how much do others hold
after an out of memory, and how a group splits its layers.

NVML counts this process's own CUDA context as used memory once CUDA is up (after the
first model load); the estimates count it too (the per-GPU overhead), so it is taken out
of the reading rather than counted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuq.fleet.affinity import GpuTarget
from gpuq.fleet.gpus import MemoryReading, nvml_memory
from gpuq.fleet.placement import Candidate, FitsFreeMemoryFilter, PlacementRequest
from gpuq.fleet.vram import DEFAULT_OVERHEAD_MIB, tensor_split
from worker.model_cache import ModelSpec

log = logging.getLogger(__name__)

Read = Callable[[Sequence[str]], list[MemoryReading] | None]


class GpuMemory:
    def __init__(self, gpu_uuids: tuple[str, ...], *, read: Read = nvml_memory) -> None:
        self._uuids = gpu_uuids
        self._read = read
        self.cuda_started = False  # set once a model was loaded: this process then holds a CUDA context

    def _own_context_mib(self) -> float:
        return DEFAULT_OVERHEAD_MIB * len(self._uuids) if self.cuda_started else 0.0

    def fits_now(self, spec: ModelSpec) -> str | None:
        """None when the model fits the GPUs' free memory now (or NVML cannot say); else
        placement's reason, with the figures."""
        readings = self._read(self._uuids)
        if readings is None:
            return None
        free = sum(r.free_mib for r in readings)
        need = int(spec.vram_mib - self._own_context_mib())
        here = Candidate(GpuTarget(",".join(self._uuids), -1, "", "", sum(r.total_mib for r in readings)), free)
        return FitsFreeMemoryFilter().reject(PlacementRequest(spec.name, "", need), here)

    def held_by_others(self) -> int | None:
        """MiB of the GPUs' memory in use by anything but this process's CUDA context (call
        it with this worker's models unloaded); None when NVML cannot say."""
        readings = self._read(self._uuids)
        if readings is None:
            return None
        return max(0, int(sum(r.used_mib for r in readings) - self._own_context_mib()))

    def tensor_split(self, spec: ModelSpec, totals_mib: Sequence[int]) -> list[float]:
        """A group's split: each GPU's free memory less its own compute buffer and CUDA
        overhead; the GPUs' totals when NVML cannot say."""
        readings = self._read(self._uuids)
        free = [float(r.free_mib) for r in readings] if readings is not None else [float(t) for t in totals_mib]
        reserve = spec.per_gpu_mib if spec.per_gpu_mib is not None else DEFAULT_OVERHEAD_MIB
        split = tensor_split(free, float(reserve))
        log.info("tensor split for %s over %s: %s", spec.name, ",".join(self._uuids), split)
        return split
