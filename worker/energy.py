"""Energy and GPU-seconds of one job, measured through NVML on the GPUs its worker holds.

Two ways to measure, chosen per GPU when the worker starts:

* NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since
  the driver loaded; Volta and newer): read at the job's start and end, the difference is
  the energy. Exact, and costs nothing while the job runs.
* Otherwise a thread samples ``nvmlDeviceGetPowerUsage`` every ``sample_interval_s`` and
  integrates power over time (trapezoids, with a sample at the start and at the end, so
  even a job shorter than the interval gets a figure). The interval is modest on purpose:
  every wake-up of another thread costs the token loop a little, and NVML's power reading
  is itself averaged over about a second on most boards.

``gpu_seconds`` is the wall time the job held its GPUs times their number. The measured
span is the whole job as the worker ran it, model load included: a load is part of what
the job cost. A GPU shared by several workers (``--slots-per-gpu``) reports the whole
GPU's energy to each job that overlaps, which is what NVML can tell.

On the CPU or a simulated GPU there is nothing to measure: no meter is made and both
figures stay null on the job row, never invented. A MIG device has neither reading (NVML
reports energy and power for the whole GPU, shared by its MIG devices): its jobs get
``gpu_seconds`` and no energy. If NVML fails during a job, the energy is null and
``gpu_seconds`` (known from the clock) is still recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from worker.device import Device

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_INTERVAL_S = 0.5
Clock = Callable[[], float]


class EnergySource(Protocol):
    """One GPU's raw readings: NVML on a real GPU (tests use a simulated stand-in)."""

    has_counter: bool  # whether energy_mj() works on this GPU
    has_power: bool  # whether power_mw() does

    def energy_mj(self) -> int:
        """Energy consumed since some fixed point, in millijoules (a monotonic counter)."""
        ...

    def power_mw(self) -> int:
        """Power drawn now, in milliwatts."""
        ...


@dataclass(frozen=True, slots=True)
class Measurement:
    gpu_seconds: float | None = None
    energy_j: float | None = None


NOT_MEASURED = Measurement()


class _PowerIntegrator:
    """Integrates the summed power of some GPUs over time in a background thread."""

    def __init__(self, sources: Sequence[EnergySource], interval_s: float, clock: Clock) -> None:
        self._sources = sources
        self._interval_s = interval_s
        self._clock = clock
        self._done = threading.Event()
        self.joules = 0.0
        self.failed = False
        self._last = (clock(), self._watts())
        self._thread = threading.Thread(target=self._run, name="energy-sampler", daemon=True)
        self._thread.start()

    def _watts(self) -> float:
        return sum(s.power_mw() for s in self._sources) / 1000

    def _sample(self) -> None:
        try:
            now, watts = self._clock(), self._watts()
        except Exception:
            log.warning("reading GPU power failed; this job's energy will not be recorded", exc_info=True)
            self.failed = True
            return
        then, watts_then = self._last
        self.joules += (now - then) * (watts_then + watts) / 2
        self._last = (now, watts)

    def _run(self) -> None:
        while not self._done.wait(self._interval_s) and not self.failed:
            self._sample()

    def finish(self) -> float | None:
        self._done.set()
        self._thread.join()
        if not self.failed:
            self._sample()  # the stretch since the last sample
        return None if self.failed else self.joules


class JobEnergy:
    """The measurement of one job, from ``EnergyMeter.start()`` to ``stop()``."""

    def __init__(self, sources: Sequence[EnergySource], interval_s: float, clock: Clock) -> None:
        self._sources = sources
        self._clock = clock
        self._counted = [s for s in sources if s.has_counter]
        sampled = [s for s in sources if not s.has_counter and s.has_power]
        self._failed = any(not (s.has_counter or s.has_power) for s in sources)  # energy unknowable: time only
        self._started = clock()
        self._counters_at_start = self._read_counters()
        self._integrator: _PowerIntegrator | None = None
        if sampled and not self._failed:
            try:
                self._integrator = _PowerIntegrator(sampled, interval_s, clock)
            except Exception:
                log.warning("reading GPU power failed; this job's energy will not be recorded", exc_info=True)
                self._failed = True

    def _read_counters(self) -> list[int]:
        try:
            return [s.energy_mj() for s in self._counted]
        except Exception:
            log.warning("reading NVML's energy counter failed; this job's energy will not be recorded", exc_info=True)
            self._failed = True
            return []

    def stop(self) -> Measurement:
        sampled_j = self._integrator.finish() if self._integrator is not None else 0.0
        counters = self._read_counters() if not self._failed else []
        elapsed_s = self._clock() - self._started
        gpu_seconds = elapsed_s * len(self._sources)
        if self._failed or sampled_j is None:
            return Measurement(gpu_seconds, None)
        deltas = [end - start for start, end in zip(self._counters_at_start, counters, strict=True)]
        if any(d < 0 for d in deltas):  # the driver was reloaded mid-job: the counter restarted
            return Measurement(gpu_seconds, None)
        return Measurement(gpu_seconds, sum(deltas) / 1000 + sampled_j)


class EnergyMeter:
    """Measures the jobs of one worker (one at a time) on its fixed set of GPUs."""

    def __init__(
        self,
        sources: Sequence[EnergySource],
        *,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        clock: Clock = time.monotonic,
    ) -> None:
        if not sources:
            raise ValueError("an energy meter needs at least one GPU")
        self._sources = tuple(sources)
        self._interval_s = sample_interval_s
        self._clock = clock

    def start(self) -> JobEnergy:
        return JobEnergy(self._sources, self._interval_s, self._clock)


# ---------------------------------------------------------------- NVML


class NvmlEnergySource:
    """A real GPU, by UUID (NVML is not affected by CUDA_VISIBLE_DEVICES)."""

    def __init__(self, pynvml: Any, uuid: str) -> None:
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self.has_counter = self._answers(pynvml.nvmlDeviceGetTotalEnergyConsumption)
        self.has_power = self.has_counter or self._answers(pynvml.nvmlDeviceGetPowerUsage)

    def _answers(self, read: Any) -> bool:
        try:
            read(self._handle)
            return True
        except self._nvml.NVMLError:  # NotSupported (before Volta, on a MIG device), FunctionNotFound (old drivers)
            return False

    def energy_mj(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def power_mw(self) -> int:
        return int(self._nvml.nvmlDeviceGetPowerUsage(self._handle))


def energy_meter_for(device: Device, *, sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S) -> EnergyMeter | None:
    """A meter on the worker's real GPUs; None on the CPU, a simulated GPU, or without NVML."""
    if not device.on_gpu or not device.gpu_uuids:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()  # kept initialised for the worker's life (NVML counts inits)
        sources = [NvmlEnergySource(pynvml, uuid) for uuid in device.gpu_uuids]
    except Exception:
        log.warning("NVML cannot read this worker's GPUs; job energy will not be recorded", exc_info=True)
        return None
    how = ", ".join(
        "energy counter" if s.has_counter else "power sampling" if s.has_power else "no energy reading" for s in sources
    )
    log.info("measuring job energy through NVML (%s)", how)
    return EnergyMeter(sources, sample_interval_s=sample_interval_s)
