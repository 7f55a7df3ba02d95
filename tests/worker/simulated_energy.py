"""A SIMULATED GPU energy source for tests: NVML cannot exist on machines without an
NVIDIA GPU, so the meter's arithmetic and threading are exercised through the same
``EnergySource`` interface with readings computed from a power profile. Never used by a
worker: on a simulated GPU a worker records no energy at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class SimulatedEnergySource:
    """Draws ``power_w(t)`` watts, t seconds after creation; with ``has_counter`` it also keeps
    NVML's millijoule counter (integrated exactly, in fine steps)."""

    def __init__(self, power_w: Callable[[float], float], *, has_counter: bool, counter_start_mj: int = 7_000_000):
        self.has_counter = has_counter
        self.has_power = True
        self._power_w = power_w
        self._t0 = time.monotonic()
        self._counter_start_mj = counter_start_mj
        self.power_reads = 0
        self.fail_after_reads: int | None = None
        self._lock = threading.Lock()

    def _t(self) -> float:
        return time.monotonic() - self._t0

    def power_mw(self) -> int:
        with self._lock:
            self.power_reads += 1
            if self.fail_after_reads is not None and self.power_reads > self.fail_after_reads:
                raise RuntimeError("simulated NVML error: GPU is lost")
        return int(self._power_w(self._t()) * 1000)

    def energy_mj(self) -> int:
        if not self.has_counter:
            raise RuntimeError("simulated NVML error: not supported")
        t, steps = self._t(), 2000
        joules = sum(self._power_w(t * (i + 0.5) / steps) for i in range(steps)) * t / steps
        return self._counter_start_mj + int(joules * 1000)


def constant(watts: float) -> Callable[[float], float]:
    return lambda _t: watts
