"""The NVML stand-in: ``libnvidia-ml.c`` beside this file, built with the system C compiler
at test time, and the inventory file it reads.

pynvml loads it as it loads NVIDIA's library: in processes started with :attr:`NvmlStandin.env`
(``LD_LIBRARY_PATH`` names its folder, so the dynamic linker finds it first), and in the test
process itself once :func:`load_in_this_process` has loaded it (the linker then answers
pynvml's ``dlopen("libnvidia-ml.so.1")`` with the library of that soname already loaded).
Everything above the C ABI (pynvml, gpuq's discovery, telemetry, health and energy code) is
the real code a GPU host runs.

The inventory is rewritten whole (to a temporary name, then renamed over the file), and the
library re-reads it when it changes, so a test can change a reading, or lose a GPU, while
the processes under test run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("libnvidia-ml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CONFIG_ENV = "NVML_STANDIN_CONFIG"
LOG_ENV = "NVML_STANDIN_LOG"


def build(directory: Path) -> Path:
    """Compiles the stand-in into ``directory``; fails (never skips) without a C compiler."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler on PATH (cc): the tests build their NVML stand-in with it")
    library = directory / LIBRARY_NAME
    command = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"]
    command += [f"-Wl,-soname,{LIBRARY_NAME}", "-o", str(library), str(SOURCE), "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the NVML stand-in failed:\n{result.stderr}")
    return library


def load_in_this_process(library: Path) -> None:
    """Make this process's pynvml use the stand-in.

    pynvml keeps the library it loaded in a module global; if an earlier call in this
    process loaded another one (a real driver on a GPU host), it is forgotten here so that
    pynvml's own loader runs again and finds the stand-in."""
    import pynvml

    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    loaded = pynvml.nvmlLib
    if loaded is not None and Path(getattr(loaded, "_name", "")).resolve() != library.resolve():
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()


@dataclass
class StandinMig:
    """A MIG device of a GPU in MIG mode."""

    uuid: str
    slot: int
    name: str = "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    memory_mib: int = 40192
    used_mib: int = 0


@dataclass
class StandinGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_mib: int = 81920
    used_mib: int = 0  # held by no process NVML lists (another container, the driver)
    util: int = 0
    mem_util: int = 0
    temp: int = 40
    power_w: float = 100.0
    energy_counter: bool = True  # NVML's total energy counter (Volta and newer)
    power_reading: bool = True
    cc: str = "8.0"
    lost: bool = False
    mig_mode: bool = False
    max_mig: int = 0
    migs: list[StandinMig] = field(default_factory=list)
    # The energy counter: energy_mj at energy_since, rising by power_w since.
    energy_mj: float = 5_000_000.0
    energy_since: float = field(default_factory=time.time)

    def counter_mj(self, at: float) -> float:
        return self.energy_mj + self.power_w * 1000 * max(0.0, at - self.energy_since)


@dataclass
class StandinProcess:
    """A process NVML lists on a device, with the memory it holds there."""

    device: str  # a GPU or MIG device UUID
    pid: int
    used_mib: int


@dataclass
class NvmlStandin:
    library: Path
    config: Path
    log: Path | None = None
    driver_version: str = "550.54.15"
    gpus: list[StandinGpu] = field(default_factory=list)
    processes: list[StandinProcess] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a process needs in its environment to load the stand-in."""
        search = [str(self.library.parent)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        env = {"LD_LIBRARY_PATH": ":".join(search), CONFIG_ENV: str(self.config)}
        if self.log is not None:
            env[LOG_ENV] = str(self.log)
        return env

    def write(self) -> None:
        lines = [f"driver\tversion={self.driver_version}"]
        for gpu in self.gpus:
            lines.append(
                _record(
                    "gpu",
                    uuid=gpu.uuid,
                    name=gpu.name,
                    memory_mib=gpu.memory_mib,
                    used_mib=gpu.used_mib,
                    util=gpu.util,
                    mem_util=gpu.mem_util,
                    temp=gpu.temp,
                    power_mw=int(gpu.power_w * 1000),
                    energy_mj=int(gpu.energy_mj),
                    energy_since=f"{gpu.energy_since:.6f}",
                    cc=gpu.cc,
                    energy=int(gpu.energy_counter),
                    power=int(gpu.power_reading),
                    lost=int(gpu.lost),
                    mig=int(gpu.mig_mode),
                    max_mig=gpu.max_mig,
                )
            )
        for parent, gpu in enumerate(self.gpus):
            for mig in gpu.migs:
                lines.append(
                    _record(
                        "mig",
                        parent=parent,
                        slot=mig.slot,
                        uuid=mig.uuid,
                        name=mig.name,
                        memory_mib=mig.memory_mib,
                        used_mib=mig.used_mib,
                    )
                )
        lines += [_record("process", device=p.device, pid=p.pid, used_mib=p.used_mib) for p in self.processes]
        temporary = self.config.with_name(self.config.name + ".tmp")
        temporary.write_text("\n".join(lines) + "\n")
        os.replace(temporary, self.config)

    def set_power(self, index: int, watts: float) -> None:
        """A new power draw from now on; the energy counter carries on from where it is."""
        gpu, now = self.gpus[index], time.time()
        gpu.energy_mj, gpu.energy_since, gpu.power_w = gpu.counter_mj(now), now, watts
        self.write()

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every NVML call about it answers NVML_ERROR_GPU_IS_LOST."""
        self.gpus[index].lost = True
        self.write()

    def calls(self) -> list[tuple[int, str]]:
        """(pid, NVML function) for each call so far, when a log was asked for."""
        if self.log is None or not self.log.exists():
            return []
        return [(int(pid), name) for pid, name in (line.split() for line in self.log.read_text().splitlines())]


def _record(kind: str, **fields: object) -> str:
    for key, value in fields.items():
        if any(c in str(value) for c in "\t\n"):
            raise ValueError(f"stand-in field {key} may not hold a tab or a newline: {value!r}")
    return "\t".join([kind, *(f"{k}={v}" for k, v in fields.items())])


def gpu_uuid(index: int) -> str:
    """A UUID in NVIDIA's format, distinct per index."""
    return f"GPU-5eed{index:04x}-0000-4000-8000-{index:012x}"


def mig_uuid(parent: int, slot: int) -> str:
    return f"MIG-5eed{parent:04x}-{slot:04x}-4000-8000-{parent * 100 + slot:012x}"
