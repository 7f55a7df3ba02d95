"""The job energy meter: NVML's energy counter where the GPU has one, power sampled and
integrated where it does not. The arithmetic and threading are exercised with a SIMULATED
energy source (tests/worker/simulated_energy.py); the NVML path itself through real pynvml,
answered by the NVML stand-in (tests/nvml_standin), whose counter runs at its set power."""

import itertools
import threading
import time
from dataclasses import dataclass

import pytest

from tests.nvml_standin import StandinMig, gpu_uuid, mig_uuid
from tests.worker.simulated_energy import SimulatedEnergySource, constant
from worker.device import ALL_LAYERS, Device
from worker.energy import EnergyMeter, Measurement, energy_meter_for


@dataclass(frozen=True)
class Span:
    """The wall time a job ran, bracketed: at least ``inner`` (from after ``start()`` returned
    to before ``stop()`` was called), at most ``outer`` (from before the one to after the other).
    A measurement between the two is right however late the machine let the test run."""

    inner: float
    outer: float

    def holds(self, seconds: float, *, gpus: int = 1) -> bool:
        return gpus * self.inner - 1e-6 <= seconds <= gpus * self.outer + 1e-6


def run_job(meter: EnergyMeter, seconds: float) -> tuple[Measurement, Span]:
    before_start = time.monotonic()
    job = meter.start()
    started = time.monotonic()
    time.sleep(seconds)
    stopping = time.monotonic()
    measured = job.stop()
    return measured, Span(stopping - started, time.monotonic() - before_start)


def test_the_energy_counter_gives_joules_over_the_job_and_gpu_seconds_its_wall_time():
    meter = EnergyMeter([SimulatedEnergySource(constant(250.0), has_counter=True)])
    measured, span = run_job(meter, 0.4)
    assert span.holds(measured.gpu_seconds)
    assert measured.energy_j == pytest.approx(250.0 * measured.gpu_seconds, rel=0.05)


def test_without_a_counter_power_is_sampled_and_integrated_including_a_change_mid_job():
    # 100 W for the first 0.3 s, then 300 W: a load starting, as a GPU sees it.
    source = SimulatedEnergySource(lambda t: 100.0 if t < 0.3 else 300.0, has_counter=False)
    reads: list[float] = []  # every time the meter read its clock: the samples, and the job's ends

    def clock() -> float:
        reads.append(time.monotonic())
        return reads[-1]

    meter = EnergyMeter([source], sample_interval_s=0.02, clock=clock)
    measured, _span = run_job(meter, 0.6)
    exact = 100.0 * 0.3 + 300.0 * (measured.gpu_seconds - 0.3)
    # One trapezoid straddles the step: off by at most half the step (200 W) times its width,
    # the longest gap between samples however late the machine ran the sampler.
    longest_gap_s = max(b - a for a, b in itertools.pairwise(reads))
    assert measured.energy_j == pytest.approx(exact, abs=100.0 * longest_gap_s + 1.0)
    assert source.power_reads >= 3  # at its start and end, and at least once while it ran


def test_a_job_shorter_than_the_sampling_interval_still_gets_a_figure():
    meter = EnergyMeter([SimulatedEnergySource(constant(80.0), has_counter=False)], sample_interval_s=5.0)
    measured, _span = run_job(meter, 0.1)
    assert measured.energy_j == pytest.approx(80.0 * measured.gpu_seconds, rel=0.1)


def test_a_gpu_group_counts_each_gpu_seconds_and_sums_their_energy():
    meter = EnergyMeter(
        [
            SimulatedEnergySource(constant(200.0), has_counter=True),
            SimulatedEnergySource(constant(100.0), has_counter=False),  # mixed: one sampled
        ],
        sample_interval_s=0.05,
    )
    measured, span = run_job(meter, 0.3)
    assert span.holds(measured.gpu_seconds, gpus=2)
    assert 200.0 * span.inner + 100.0 * span.inner - 0.01 <= measured.energy_j <= 300.0 * span.outer + 0.01


def test_an_nvml_failure_mid_job_records_no_energy_but_still_the_gpu_seconds():
    source = SimulatedEnergySource(constant(150.0), has_counter=False)
    source.fail_after_reads = 3
    meter = EnergyMeter([source], sample_interval_s=0.02)
    measured, span = run_job(meter, 0.2)
    assert measured.energy_j is None  # never a guess
    assert span.holds(measured.gpu_seconds)


def test_the_sampling_thread_ends_with_the_job():
    meter = EnergyMeter([SimulatedEnergySource(constant(50.0), has_counter=False)], sample_interval_s=0.01)
    before = {t.name for t in threading.enumerate()}
    job = meter.start()
    assert "energy-sampler" in {t.name for t in threading.enumerate()}
    job.stop()
    assert {t.name for t in threading.enumerate()} == before


def test_no_meter_on_the_cpu_or_a_simulated_gpu():
    assert energy_meter_for(Device(label="cpu", gpu_layers=0)) is None
    simulated = Device(label="simulated:GPU-SIM-00-abc", gpu_layers=0, gpu_uuids=("GPU-SIM-00-abc",))
    assert energy_meter_for(simulated) is None


def cuda(*uuids):
    return Device(label=f"cuda:{','.join(uuids)}", gpu_layers=ALL_LAYERS, gpu_uuids=uuids)


def test_through_nvml_the_energy_counter_gives_power_times_time(nvml):
    meter = energy_meter_for(cuda(gpu_uuid(0)))  # the stand-in's GPU 0 draws 100 W
    measured, _span = run_job(meter, 0.5)
    assert measured.energy_j == pytest.approx(100.0 * measured.gpu_seconds, rel=0.05)
    assert "nvmlDeviceGetTotalEnergyConsumption" in {name for _pid, name in nvml.calls()}


def test_through_nvml_a_gpu_without_the_counter_is_sampled(nvml):
    nvml.gpus[1].energy_counter = False
    nvml.write()
    meter = energy_meter_for(cuda(gpu_uuid(1)), sample_interval_s=0.05)  # 30 W
    measured, _span = run_job(meter, 0.5)
    assert measured.energy_j == pytest.approx(30.0 * measured.gpu_seconds, rel=0.05)
    assert "nvmlDeviceGetPowerUsage" in {name for _pid, name in nvml.calls()}


def test_a_mig_device_records_its_gpu_seconds_and_no_energy(nvml):
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 0), slot=0)]
    nvml.write()
    measured, span = run_job(energy_meter_for(cuda(mig_uuid(0, 0))), 0.2)
    # NVML reports energy and power for the whole GPU, shared by its MIG devices: none is charged.
    assert measured.energy_j is None and span.holds(measured.gpu_seconds)


def test_a_gpu_lost_mid_job_records_no_energy(nvml):
    meter = energy_meter_for(cuda(gpu_uuid(0)))
    job = meter.start()
    nvml.lose(0)
    measured = job.stop()
    assert measured.energy_j is None and measured.gpu_seconds is not None
