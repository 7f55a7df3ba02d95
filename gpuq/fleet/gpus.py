"""The GPUs of this host: NVML when there is an NVIDIA driver, else a simulated inventory
from configuration, else none (CPU mode). One function, one frozen type, either way.

The simulation exists so that placement, pinning and routing run with real worker
processes on machines without GPUs (CI, laptops). It is named as such everywhere it
shows: ``simulated=True`` on each GPU, "(simulated)" in its name, a ``GPU-SIM-`` UUID,
and a warning in the log.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

MIB = 1 << 20
SIMULATED_UUID_PREFIX = "GPU-SIM-"


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_free_mib: int
    utilisation_pct: int | None
    temperature_c: int | None
    power_w: float | None
    compute_capability: str | None
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class Inventory:
    host: str
    source: str  # "nvml", "simulated" or "none"
    gpus: tuple[GpuInfo, ...]

    def by_uuid(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class InvalidSimulation(ValueError):
    """GPUQ_SIMULATED_GPUS cannot be read as GiB sizes."""


def parse_simulated_sizes(spec: str) -> list[float]:
    """``"24,24,48,80"`` -> GiB per simulated GPU."""
    sizes = []
    for part in spec.split(","):
        try:
            size = float(part.strip().removesuffix("GiB").removesuffix("G"))
        except ValueError:
            raise InvalidSimulation(f"GPUQ_SIMULATED_GPUS: {part.strip()!r} is not a size in GiB") from None
        if size <= 0:
            raise InvalidSimulation(f"GPUQ_SIMULATED_GPUS: sizes must be positive, got {size}")
        sizes.append(size)
    return sizes


def simulated_inventory(host: str, sizes_gib: list[float]) -> Inventory:
    gpus = []
    for index, size in enumerate(sizes_gib):
        digest = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()[:12]
        total = int(size * 1024)
        gpus.append(
            GpuInfo(
                index=index,
                uuid=f"{SIMULATED_UUID_PREFIX}{index:02d}-{digest}",
                name=f"Simulated GPU {size:g} GiB (simulated)",
                memory_total_mib=total,
                memory_free_mib=total,
                utilisation_pct=None,
                temperature_c=None,
                power_w=None,
                compute_capability=None,
                simulated=True,
            )
        )
    return Inventory(host, "simulated", tuple(gpus))


def nvml_inventory(host: str) -> Inventory | None:
    """The real GPUs, read through NVML; None when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        gpus = tuple(_read_nvml_gpu(pynvml, i) for i in range(count))
    finally:
        pynvml.nvmlShutdown()
    return Inventory(host, "nvml", gpus) if gpus else None


def _optional(read: Any, *args: Any) -> Any:
    """Telemetry some GPUs do not report (power on some boards, say) is None, not an error."""
    try:
        return read(*args)
    except Exception:
        return None


def _read_nvml_gpu(pynvml: Any, index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    utilisation = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
    power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
    capability = _optional(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    return GpuInfo(
        index=index,
        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
        name=name.decode() if isinstance(name, bytes) else name,
        memory_total_mib=int(memory.total // MIB),
        memory_free_mib=int(memory.free // MIB),
        utilisation_pct=utilisation.gpu if utilisation is not None else None,
        temperature_c=_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        power_w=power_mw / 1000 if power_mw is not None else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
    )


def discover_gpus(*, simulated: str = "", host: str = "") -> Inventory:
    """Simulated when configured (it wins, so tests are the same on GPU hosts), else NVML,
    else an empty inventory: CPU mode."""
    host = host or socket.gethostname()
    if simulated:
        log.warning("using a SIMULATED GPU inventory (%s GiB); no real GPU is used", simulated)
        return simulated_inventory(host, parse_simulated_sizes(simulated))
    return nvml_inventory(host) or Inventory(host, "none", ())


def with_free_memory(gpu: GpuInfo, used_mib: float) -> GpuInfo:
    """A simulated GPU's free memory is what gpuq's own estimates say its models use."""
    return replace(gpu, memory_free_mib=max(0, int(gpu.memory_total_mib - used_mib)))
