"""Which device this worker runs on, decided once at start, and the refusal to start when a
worker pinned to GPUs could not run on them.

The launcher (the supervisor, or ``gpuq worker --gpus``) sets ``CUDA_VISIBLE_DEVICES``
to GPU (or MIG) UUIDs before anything imports llama.cpp, so inside the worker CUDA device 0
is always its own GPU and indices never disagree with NVML.

A pinned worker runs on its GPUs or not at all. Falling back to the CPU quietly (a CPU
build of llama-cpp-python, CUDA failing to start, a wrong UUID, a GPU lost after an Xid
error) would leave a worker that serves every model on the CPU, outside affinity rules,
with no VRAM budget, health tracking or energy meter. So before it takes a job it checks
that NVML answers for each of its GPUs and that llama.cpp sees as many GPUs as it is pinned
to; otherwise it marks the GPUs unhealthy with the reason and exits with
``EXIT_DEVICE_UNUSABLE``. The llama.cpp half of the check is a function passed in
(``gpu_devices``), and ``GPUQ_WORKER_OFFLOAD_CHECK=false`` skips it: tests pin workers to
the NVML stand-in's GPUs while llama.cpp runs on the CPU.

A worker pinned to a *simulated* GPU (UUID ``GPU-SIM-...``) runs llama.cpp on the CPU
and says so on every job it records: ``simulated:<uuid>``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuq.fleet.gpus import SIMULATED_UUID_PREFIX

CPU = "cpu"
ALL_LAYERS = -1
GGML_BACKEND_DEVICE_TYPE_GPU = 1  # ggml-backend.h: CPU = 0, GPU = 1


@dataclass(frozen=True, slots=True)
class Device:
    label: str  # "cpu", "cuda:<uuid>[,<uuid>]" or "simulated:<uuid>[,<uuid>]", recorded on every job row
    gpu_layers: int
    gpu_uuids: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        """Running on a real CUDA device (not the CPU, not a simulated GPU)."""
        return self.label.startswith("cuda:")


class DeviceUnusable(RuntimeError):
    """This worker is pinned to GPUs it cannot run on; the message says why and what to do."""

    def __init__(self, gpu_uuids: Sequence[str], reason: str) -> None:
        super().__init__(reason)
        self.gpu_uuids = tuple(gpu_uuids)


def pin_to_gpus(gpu_uuids: list[str]) -> None:
    """Set the CUDA environment for this process. Must run before llama.cpp is imported."""
    if "llama_cpp" in sys.modules:
        raise RuntimeError("llama_cpp was imported before the worker was pinned to its GPUs")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)


def pinned_gpus() -> tuple[str, ...]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(u for u in visible.split(",") if u and u != "-1")


def llama_gpu_devices() -> int:
    """How many GPUs llama.cpp (ggml's backend registry) can offload to in this process: 0
    with a CPU build, or when CUDA found none of the devices it was given."""
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        return 0
    from llama_cpp._ggml import libggml

    libggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    libggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    libggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    libggml.ggml_backend_dev_type.restype = ctypes.c_int
    devices = (libggml.ggml_backend_dev_get(i) for i in range(libggml.ggml_backend_dev_count()))
    return sum(1 for d in devices if libggml.ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU)


def nvml_problems(gpu_uuids: Sequence[str]) -> list[str]:
    """What NVML says is wrong with these GPUs (absent, lost); empty when each answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return [f"NVML cannot be used ({exc}): no NVIDIA driver on this host?"]
    problems = []
    try:
        for uuid in gpu_uuids:
            try:
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            except pynvml.NVMLError as exc:
                problems.append(f"{uuid}: NVML {exc}")
    finally:
        pynvml.nvmlShutdown()
    return problems


def detect_device(*, check_offload: bool = True, gpu_devices: Callable[[], int] = llama_gpu_devices) -> Device:
    """The device this worker runs on. Raises :class:`DeviceUnusable` for a worker pinned to
    GPUs it cannot use, rather than running it on the CPU."""
    uuids = pinned_gpus()
    if not uuids:
        return Device(label=CPU, gpu_layers=0)
    simulated = [u.startswith(SIMULATED_UUID_PREFIX) for u in uuids]
    if all(simulated):
        return Device(label=f"simulated:{','.join(uuids)}", gpu_layers=0, gpu_uuids=uuids)
    if any(simulated):
        raise DeviceUnusable(uuids, "a worker cannot be pinned to simulated and real GPUs at once")
    problems = nvml_problems(uuids)
    if problems:
        raise DeviceUnusable(uuids, "NVML does not answer for this worker's GPUs: " + "; ".join(problems))
    if check_offload:
        seen = gpu_devices()
        if seen < len(uuids):
            raise DeviceUnusable(uuids, _offload_problem(seen, len(uuids)))
    return Device(label=f"cuda:{','.join(uuids)}", gpu_layers=ALL_LAYERS, gpu_uuids=uuids)


def _offload_problem(seen: int, pinned: int) -> str:
    if seen == 0:
        return (
            f"llama.cpp can offload to none of the {pinned} GPU(s) this worker is pinned to: a CPU build of "
            "llama-cpp-python (run scripts/install.sh on this GPU host: it builds and force-installs the CUDA "
            "wheel), or CUDA could not open the devices (driver, CUDA_VISIBLE_DEVICES, a GPU lost after an Xid)"
        )
    return f"llama.cpp sees {seen} GPU(s) of the {pinned} this worker is pinned to: CUDA could not open the others"
