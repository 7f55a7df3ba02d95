"""The job energy meter: NVML's energy counter where the GPU has one, power sampled and
integrated where it does not. The arithmetic and threading are exercised with a SIMULATED
energy source (tests/worker/simulated_energy.py); the NVML path itself through real pynvml,
answered by the NVML stand-in (tests/nvml_standin), whose counter runs at its set power."""

import threading
import time

import pytest

from tests.nvml_standin import StandinMig, gpu_uuid, mig_uuid
from tests.worker.simulated_energy import SimulatedEnergySource, constant
from worker.device import ALL_LAYERS, Device
from worker.energy import EnergyMeter, energy_meter_for


def run_job(meter: EnergyMeter, seconds: float):
    job = meter.start()
    time.sleep(seconds)
    return job.stop()


def test_the_energy_counter_gives_joules_over_the_job_and_gpu_seconds_its_wall_time():
    meter = EnergyMeter([SimulatedEnergySource(constant(250.0), has_counter=True)])
    measured = run_job(meter, 0.4)
    assert measured.gpu_seconds == pytest.approx(0.4, abs=0.05)
    assert measured.energy_j == pytest.approx(250.0 * measured.gpu_seconds, rel=0.05)


def test_without_a_counter_power_is_sampled_and_integrated_including_a_change_mid_job():
    # 100 W for the first 0.3 s, then 300 W: a load starting, as a GPU sees it.
    source = SimulatedEnergySource(lambda t: 100.0 if t < 0.3 else 300.0, has_counter=False)
    meter = EnergyMeter([source], sample_interval_s=0.02)
    measured = run_job(meter, 0.6)
    exact = 100.0 * 0.3 + 300.0 * (measured.gpu_seconds - 0.3)
    assert measured.energy_j == pytest.approx(exact, abs=8.0)  # one trapezoid straddles the step
    assert source.power_reads >= 10  # it really sampled while the job ran


def test_a_job_shorter_than_the_sampling_interval_still_gets_a_figure():
    meter = EnergyMeter([SimulatedEnergySource(constant(80.0), has_counter=False)], sample_interval_s=5.0)
    measured = run_job(meter, 0.1)
    assert measured.energy_j == pytest.approx(80.0 * measured.gpu_seconds, rel=0.1)


def test_a_gpu_group_counts_each_gpu_seconds_and_sums_their_energy():
    meter = EnergyMeter(
        [
            SimulatedEnergySource(constant(200.0), has_counter=True),
            SimulatedEnergySource(constant(100.0), has_counter=False),  # mixed: one sampled
        ],
        sample_interval_s=0.05,
    )
    job = meter.start()
    started = time.monotonic()
    time.sleep(0.3)
    measured = job.stop()
    wall = time.monotonic() - started
    assert measured.gpu_seconds == pytest.approx(2 * wall, abs=0.05)
    assert measured.energy_j == pytest.approx(300.0 * wall, rel=0.08)


def test_an_nvml_failure_mid_job_records_no_energy_but_still_the_gpu_seconds():
    source = SimulatedEnergySource(constant(150.0), has_counter=False)
    source.fail_after_reads = 3
    meter = EnergyMeter([source], sample_interval_s=0.02)
    measured = run_job(meter, 0.2)
    assert measured.energy_j is None  # never a guess
    assert measured.gpu_seconds == pytest.approx(0.2, abs=0.05)


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
    measured = run_job(meter, 0.5)
    assert measured.energy_j == pytest.approx(100.0 * measured.gpu_seconds, rel=0.05)
    assert "nvmlDeviceGetTotalEnergyConsumption" in {name for _pid, name in nvml.calls()}


def test_through_nvml_a_gpu_without_the_counter_is_sampled(nvml):
    nvml.gpus[1].energy_counter = False
    nvml.write()
    meter = energy_meter_for(cuda(gpu_uuid(1)), sample_interval_s=0.05)  # 30 W
    measured = run_job(meter, 0.5)
    assert measured.energy_j == pytest.approx(30.0 * measured.gpu_seconds, rel=0.05)
    assert "nvmlDeviceGetPowerUsage" in {name for _pid, name in nvml.calls()}


def test_a_mig_device_records_its_gpu_seconds_and_no_energy(nvml):
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 0), slot=0)]
    nvml.write()
    measured = run_job(energy_meter_for(cuda(mig_uuid(0, 0))), 0.2)
    # NVML reports energy and power for the whole GPU, shared by its MIG devices: none is charged.
    assert measured.energy_j is None and measured.gpu_seconds == pytest.approx(0.2, abs=0.05)


def test_a_gpu_lost_mid_job_records_no_energy(nvml):
    meter = energy_meter_for(cuda(gpu_uuid(0)))
    job = meter.start()
    nvml.lose(0)
    measured = job.stop()
    assert measured.energy_j is None and measured.gpu_seconds is not None
