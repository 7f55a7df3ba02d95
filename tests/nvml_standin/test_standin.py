"""The stand-in answers pynvml's calls as a driver would: what gpuq's code does not reach on
its own (MIG handle round trips, the v2 memory struct, process lists, error codes)."""

import pynvml
import pytest

from tests.nvml_standin import StandinMig, StandinProcess, gpu_uuid, mig_uuid


@pytest.fixture
def initialised(nvml):
    pynvml.nvmlInit()
    yield nvml
    pynvml.nvmlShutdown()


def test_system_and_device_identity(initialised):
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlDeviceGetCount() == 2
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid(1))
    assert pynvml.nvmlDeviceGetIndex(handle) == 1 and pynvml.nvmlDeviceGetName(handle) == "NVIDIA L4"
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-nope")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(7)


def test_memory_both_structs_and_the_processes_holding_it(initialised):
    nvml = initialised
    nvml.gpus[0].used_mib = 100
    nvml.processes = [StandinProcess(gpu_uuid(0), pid=11, used_mib=1000), StandinProcess(gpu_uuid(0), 12, 2000)]
    nvml.write()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (v1.total, v1.used, v1.free) == (v2.total, v2.used, v2.free) == (81920 << 20, 3100 << 20, 78820 << 20)
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in processes] == [(11, 1000 << 20), (12, 2000 << 20)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_mig_handles_go_both_ways(initialised):
    nvml = initialised
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 3), slot=3)]
    nvml.write()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1] and pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 3)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == gpu_uuid(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(1))  # not a MIG-capable board


def test_the_energy_counter_runs_at_the_set_power_and_stays_continuous_across_changes(initialised):
    nvml = initialised
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    first = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    nvml.set_power(0, 250.0)
    after = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert 0 <= after - first < 100 * 1000  # no jump at the change (under a second at 100 W)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 250_000


def test_a_lost_gpu_answers_gpu_is_lost_to_everything(initialised):
    nvml = initialised
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    nvml.lose(1)
    for call in (pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetUUID):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == gpu_uuid(0)
