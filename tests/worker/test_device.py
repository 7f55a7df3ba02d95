"""A worker pinned to GPUs runs on them or refuses to start: never quietly on the CPU.

NVML answers through the stand-in (tests/nvml_standin); llama.cpp here is the real CPU
build, which is exactly the "CPU wheel on a GPU host" case."""

import pytest

from tests.nvml_standin import gpu_uuid
from worker.device import ALL_LAYERS, DeviceUnusable, detect_device, llama_gpu_devices


@pytest.fixture
def pinned(monkeypatch):
    def pin(*uuids):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(uuids))

    return pin


def test_a_cpu_build_of_llama_cpp_is_refused_for_a_pinned_worker(nvml, pinned):
    pinned(gpu_uuid(0))
    assert llama_gpu_devices() == 0  # this machine's llama-cpp-python, as built by scripts/install.sh
    with pytest.raises(DeviceUnusable) as refused:
        detect_device()  # the default check asks llama.cpp itself
    assert refused.value.gpu_uuids == (gpu_uuid(0),)
    assert "CPU build of llama-cpp-python" in str(refused.value) and "scripts/install.sh" in str(refused.value)


def test_llama_cpp_seeing_fewer_gpus_than_pinned_is_refused(nvml, pinned):
    pinned(gpu_uuid(0), gpu_uuid(1))
    with pytest.raises(DeviceUnusable, match=r"llama\.cpp sees 1 GPU"):
        detect_device(gpu_devices=lambda: 1)  # CUDA opened one of the two
    assert detect_device(gpu_devices=lambda: 2).label == f"cuda:{gpu_uuid(0)},{gpu_uuid(1)}"


def test_a_gpu_nvml_does_not_know_or_has_lost_is_refused_before_llama_cpp_is_asked(nvml, pinned):
    asked = []
    pinned("GPU-00000000-dead-beef-0000-000000000000")
    with pytest.raises(DeviceUnusable, match="Not Found"):
        detect_device(gpu_devices=lambda: asked.append(1) or 1)
    nvml.lose(1)
    pinned(gpu_uuid(1))
    with pytest.raises(DeviceUnusable, match="GPU is lost"):
        detect_device(gpu_devices=lambda: asked.append(1) or 1)
    assert asked == []


def test_with_the_offload_check_off_a_pinned_worker_is_on_its_gpu(nvml, pinned):
    pinned(gpu_uuid(1))
    device = detect_device(check_offload=False)
    assert (device.label, device.gpu_layers, device.gpu_uuids, device.on_gpu) == (
        f"cuda:{gpu_uuid(1)}",
        ALL_LAYERS,
        (gpu_uuid(1),),
        True,
    )


def test_without_a_driver_a_pinned_worker_is_refused(nvml, pinned, monkeypatch):
    monkeypatch.delenv("NVML_STANDIN_CONFIG")
    pinned(gpu_uuid(0))
    with pytest.raises(DeviceUnusable, match="NVML cannot be used"):
        detect_device(check_offload=False)


def test_unpinned_workers_run_on_the_cpu_and_simulated_gpus_say_so(pinned, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_device().label == "cpu"
    pinned("GPU-SIM-00-abc")
    device = detect_device()
    assert (device.label, device.gpu_layers, device.on_gpu) == ("simulated:GPU-SIM-00-abc", 0, False)
    pinned("GPU-SIM-00-abc", gpu_uuid(0))
    with pytest.raises(DeviceUnusable, match="simulated and real"):
        detect_device()
