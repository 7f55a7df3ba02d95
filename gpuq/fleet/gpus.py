"""The GPUs of this host: NVML when there is an NVIDIA driver, else a simulated inventory
from configuration, else none (CPU mode). One function, one frozen type, either way.

NVML is read through pynvml (nvidia-ml-py). Three things a real host does that this module
handles:

* **A GPU that stops answering** (``NVML_ERROR_GPU_IS_LOST`` after an Xid error, say) is
  listed apart as unreadable, with the error; the others are read as usual, so one lost
  GPU never hides the healthy ones.
* **MIG**: a GPU in MIG mode cannot run CUDA work itself; its MIG devices can, each
  pinned by its own ``MIG-`` UUID. They are listed in its place, with the GPU's index
  (so a rule on "GPU 0" covers its MIG devices) and ``mig_slot`` set.
* **An existing ``CUDA_VISIBLE_DEVICES``** (a container given some of the host's GPUs, or
  an admin keeping GPUs for something else) restricts the inventory as CUDA would:
  indices, GPU or MIG UUIDs, or unique prefixes of them; an entry naming no device ends
  the list, as it does for CUDA. Indices are read in NVML's PCI bus order, the order
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (which gpuq sets for its workers) gives CUDA.

The simulation exists so that placement, pinning and routing run with real worker
processes on machines without GPUs (CI, laptops). It is named as such everywhere it
shows: ``simulated=True`` on each GPU, "(simulated)" in its name, a ``GPU-SIM-`` UUID,
and a warning in the log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

MIB = 1 << 20
SIMULATED_UUID_PREFIX = "GPU-SIM-"
MIG_UUID_PREFIX = "MIG-"
VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # NVML's index of the GPU (of its GPU, for a MIG device)
    uuid: str
    name: str
    memory_total_mib: int
    memory_free_mib: int
    utilisation_pct: int | None
    temperature_c: int | None
    power_w: float | None
    compute_capability: str | None
    simulated: bool = False
    mig_slot: int | None = None  # a MIG device's place on its GPU; None for a whole GPU
    parent_uuid: str | None = None  # a MIG device's GPU

    @property
    def slot_name(self) -> str:
        """How the supervisor names the worker slot on this device: ``gpu0``, ``gpu0-mig1``."""
        return f"gpu{self.index}" + (f"-mig{self.mig_slot}" if self.mig_slot is not None else "")


@dataclass(frozen=True, slots=True)
class UnreadableGpu:
    """A GPU NVML counts but cannot read (lost, or failing): never given work."""

    index: int
    uuid: str | None  # None when even its handle could not be had
    error: str


@dataclass(frozen=True, slots=True)
class Inventory:
    host: str
    source: str  # "nvml", "simulated" or "none"
    gpus: tuple[GpuInfo, ...]
    unreadable: tuple[UnreadableGpu, ...] = ()

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


def is_mig_uuid(uuid: str) -> bool:
    return uuid.startswith(MIG_UUID_PREFIX)


# ---------------------------------------------------------------- NVML


def nvml_inventory(host: str, *, visible: str | None = None) -> Inventory | None:
    """The real GPUs, read through NVML and restricted to ``visible`` (a
    ``CUDA_VISIBLE_DEVICES`` value; None: no restriction); None when there is no driver
    or no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    gpus: list[GpuInfo] = []
    unreadable: list[UnreadableGpu] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                gpus.extend(_read_nvml_devices(pynvml, index))
            except pynvml.NVMLError as exc:
                uuid = _uuid_if_readable(pynvml, index)
                log.error("GPU %d (%s) cannot be read through NVML: %s", index, uuid or "UUID unknown", exc)
                unreadable.append(UnreadableGpu(index, uuid, f"NVML: {exc}"))
    finally:
        pynvml.nvmlShutdown()
    if visible is not None:
        gpus = restrict_to_visible(gpus, visible)
        unreadable = [u for u in unreadable if _unreadable_visible(u, visible)]
    if not gpus and not unreadable:
        return None
    return Inventory(host, "nvml", tuple(gpus), tuple(unreadable))


def _unsupported(pynvml: Any) -> tuple[type[BaseException], ...]:
    """pynvml's errors for a reading a board (or a driver) does not offer."""
    return (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission)


def _optional(pynvml: Any, read: Any, *args: Any) -> Any:
    """Telemetry some GPUs do not report (power on some boards, anything per MIG device) is
    None. Any other NVML error (a lost GPU) is raised: the GPU is then unreadable."""
    try:
        return read(*args)
    except _unsupported(pynvml):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read_nvml_devices(pynvml: Any, index: int) -> list[GpuInfo]:
    """The GPU at ``index``, or its MIG devices when it is in MIG mode."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    gpu = _read_device(pynvml, handle, index)
    if not _mig_enabled(pynvml, handle):
        return [gpu]
    migs = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue  # no MIG device configured in this slot
        device = _read_device(pynvml, mig, index)
        # Utilisation and power are the whole GPU's (NVML does not split them); the
        # temperature is the GPU's too, and harmless to show.
        migs.append(
            replace(
                device,
                mig_slot=slot,
                parent_uuid=gpu.uuid,
                temperature_c=gpu.temperature_c,
                compute_capability=gpu.compute_capability,
            )
        )
    if not migs:
        log.warning("GPU %d (%s) is in MIG mode with no MIG devices: CUDA cannot use it", index, gpu.uuid)
    return migs


def _mig_enabled(pynvml: Any, handle: Any) -> bool:
    mode = _optional(pynvml, pynvml.nvmlDeviceGetMigMode, handle)
    return mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE


def _read_device(pynvml: Any, handle: Any, index: int) -> GpuInfo:
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    utilisation = _optional(pynvml, pynvml.nvmlDeviceGetUtilizationRates, handle)
    power_mw = _optional(pynvml, pynvml.nvmlDeviceGetPowerUsage, handle)
    capability = _optional(pynvml, pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    return GpuInfo(
        index=index,
        uuid=uuid,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_total_mib=int(memory.total // MIB),
        memory_free_mib=int(memory.free // MIB),
        utilisation_pct=utilisation.gpu if utilisation is not None else None,
        temperature_c=_optional(pynvml, pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        power_w=power_mw / 1000 if power_mw is not None else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
    )


def _uuid_if_readable(pynvml: Any, index: int) -> str | None:
    try:
        return _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
    except pynvml.NVMLError:
        return None


@dataclass(frozen=True, slots=True)
class MemoryReading:
    total_mib: int
    free_mib: int

    @property
    def used_mib(self) -> int:
        return self.total_mib - self.free_mib


def nvml_memory(gpu_uuids: Sequence[str]) -> list[MemoryReading] | None:
    """The memory of these GPUs (or MIG devices) now, in their order; None when NVML cannot
    read every one of them (no driver, a lost GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        readings = []
        for uuid in gpu_uuids:
            memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            readings.append(MemoryReading(int(memory.total // MIB), int(memory.free // MIB)))
        return readings
    except pynvml.NVMLError as exc:
        log.warning("NVML cannot read the memory of %s: %s", ",".join(gpu_uuids), exc)
        return None
    finally:
        pynvml.nvmlShutdown()


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def _names(token: str, gpu: GpuInfo) -> bool:
    if token.isdigit():
        return gpu.index == int(token)
    if token.startswith(MIG_UUID_PREFIX):
        return gpu.mig_slot is not None and gpu.uuid.startswith(token)
    if token.startswith("GPU-"):
        return (gpu.parent_uuid or gpu.uuid).startswith(token)
    return False


def restrict_to_visible(gpus: Sequence[GpuInfo], visible: str) -> list[GpuInfo]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value leaves, in its order. An index or a GPU
    UUID names the GPU (or all its MIG devices); an entry naming nothing, or more than one
    GPU, ends the list, as CUDA reads it."""
    chosen: list[GpuInfo] = []
    for token in (t.strip() for t in visible.split(",")):
        matches = [g for g in gpus if _names(token, g)]
        if not matches or len({g.parent_uuid or g.uuid for g in matches}) > 1:
            if token:
                log.warning(
                    "%s entry %r names no single GPU: it and the entries after it are ignored, as CUDA does",
                    VISIBLE_DEVICES_ENV,
                    token,
                )
            break
        chosen += [g for g in matches if g not in chosen]
    return chosen


def _unreadable_visible(gpu: UnreadableGpu, visible: str) -> bool:
    """Whether an unreadable GPU is one of those ``visible`` leaves this host (as far as can be
    told: a GPU whose UUID is unknown matches by index only)."""
    for token in (t.strip() for t in visible.split(",")):
        if token.isdigit() and int(token) == gpu.index:
            return True
        if gpu.uuid is not None and token.startswith("GPU-") and gpu.uuid.startswith(token):
            return True
    return False


# ---------------------------------------------------------------- either way


def discover_gpus(*, simulated: str = "", host: str = "", visible: str | None = None) -> Inventory:
    """Simulated when configured (it wins, so tests are the same on GPU hosts), else NVML
    (restricted by ``visible``, default this process's ``CUDA_VISIBLE_DEVICES``), else an
    empty inventory: CPU mode."""
    host = host or socket.gethostname()
    if simulated:
        log.warning("using a SIMULATED GPU inventory (%s GiB); no real GPU is used", simulated)
        return simulated_inventory(host, parse_simulated_sizes(simulated))
    if visible is None:
        visible = os.environ.get(VISIBLE_DEVICES_ENV)
    return nvml_inventory(host, visible=visible) or Inventory(host, "none", ())


def with_free_memory(gpu: GpuInfo, used_mib: float) -> GpuInfo:
    """A simulated GPU's free memory is what gpuq's own estimates say its models use."""
    return replace(gpu, memory_free_mib=max(0, int(gpu.memory_total_mib - used_mib)))
