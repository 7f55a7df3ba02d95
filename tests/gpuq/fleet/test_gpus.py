"""GPU discovery through real pynvml, answered by the NVML stand-in (tests/nvml_standin)."""

import pytest

from gpuq.fleet.gpus import discover_gpus, nvml_inventory, restrict_to_visible
from tests.nvml_standin import StandinMig, StandinProcess, gpu_uuid, mig_uuid


def test_discovery_reads_each_gpu_through_pynvml(nvml):
    nvml.gpus[0].used_mib = 1000
    nvml.processes = [StandinProcess(gpu_uuid(0), pid=4242, used_mib=3096)]
    nvml.write()
    inventory = discover_gpus(host="node1")
    assert inventory.source == "nvml" and inventory.host == "node1" and inventory.unreadable == ()
    first, second = inventory.gpus
    assert (first.index, first.uuid, first.name) == (0, gpu_uuid(0), "NVIDIA A100-SXM4-80GB")
    assert (first.memory_total_mib, first.memory_free_mib) == (81920, 81920 - 1000 - 3096)
    readings = (first.utilisation_pct, first.temperature_c, first.power_w, first.compute_capability)
    assert readings == (5, 41, 100.0, "8.0")
    assert (second.uuid, second.memory_free_mib, second.compute_capability, second.slot_name) == (
        gpu_uuid(1),
        23034,
        "8.9",
        "gpu1",
    )
    called = {name for _pid, name in nvml.calls()}
    assert {"nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlShutdown"} <= called


def test_a_board_without_power_readings_reports_none_not_an_error(nvml):
    nvml.gpus[1].power_reading = False
    nvml.write()
    assert [g.power_w for g in discover_gpus().gpus] == [100.0, None]


def test_without_a_driver_the_host_is_in_cpu_mode(nvml, monkeypatch):
    monkeypatch.delenv("NVML_STANDIN_CONFIG")  # the stand-in then fails nvmlInit as a host without a driver does
    assert nvml_inventory("node1") is None
    assert discover_gpus(host="node1").source == "none" and discover_gpus().gpus == ()


def test_a_lost_gpu_is_listed_apart_and_the_others_are_still_read(nvml):
    nvml.gpus.append(type(nvml.gpus[0])(gpu_uuid(2), "NVIDIA L4", memory_mib=23034))
    nvml.lose(1)
    inventory = discover_gpus(host="node1")
    assert [g.uuid for g in inventory.gpus] == [gpu_uuid(0), gpu_uuid(2)]
    [lost] = inventory.unreadable
    assert (lost.index, lost.uuid) == (1, None) and "GPU is lost" in lost.error


def test_a_gpu_in_mig_mode_is_replaced_by_its_mig_devices(nvml):
    gpu = nvml.gpus[0]
    gpu.mig_mode, gpu.max_mig = True, 7
    gpu.migs = [
        StandinMig(mig_uuid(0, 0), slot=0, name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", memory_mib=40192),
        StandinMig(mig_uuid(0, 2), slot=2, name="NVIDIA A100-SXM4-80GB MIG 2g.20gb", memory_mib=19968, used_mib=512),
    ]
    nvml.write()
    migs, whole = discover_gpus().gpus[:2], discover_gpus().gpus[2]
    assert [(m.index, m.mig_slot, m.uuid, m.slot_name) for m in migs] == [
        (0, 0, mig_uuid(0, 0), "gpu0-mig0"),
        (0, 2, mig_uuid(0, 2), "gpu0-mig2"),
    ]
    assert [(m.memory_total_mib, m.memory_free_mib) for m in migs] == [(40192, 40192), (19968, 19968 - 512)]
    assert {m.parent_uuid for m in migs} == {gpu_uuid(0)}
    # NVML reports utilisation and power per GPU, not per MIG device: none is invented.
    assert {(m.utilisation_pct, m.power_w) for m in migs} == {(None, None)}
    assert (whole.uuid, whole.mig_slot) == (gpu_uuid(1), None)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", [gpu_uuid(1)]),
        ("1,0", [gpu_uuid(1), gpu_uuid(0)]),
        (gpu_uuid(1)[:12], [gpu_uuid(1)]),  # a unique prefix, as CUDA accepts
        ("0,no-such-gpu,1", [gpu_uuid(0)]),  # CUDA stops at the first entry naming no device
        ("GPU-5eed", []),  # a prefix of both names neither
        ("", []),
        ("-1", []),
    ],
)
def test_an_existing_cuda_visible_devices_restricts_the_inventory(nvml, monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [g.uuid for g in discover_gpus().gpus] == expected


def test_cuda_visible_devices_can_name_one_mig_device(nvml, monkeypatch):
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 0), slot=0), StandinMig(mig_uuid(0, 1), slot=1)]
    nvml.write()
    everything = discover_gpus().gpus
    assert [g.uuid for g in restrict_to_visible(everything, mig_uuid(0, 1))] == [mig_uuid(0, 1)]
    assert [g.uuid for g in restrict_to_visible(everything, "0")] == [mig_uuid(0, 0), mig_uuid(0, 1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{mig_uuid(0, 1)},{gpu_uuid(1)}")
    assert [g.uuid for g in discover_gpus().gpus] == [mig_uuid(0, 1), gpu_uuid(1)]


def test_a_lost_gpu_outside_cuda_visible_devices_is_not_this_hosts_concern(nvml, monkeypatch):
    nvml.lose(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    inventory = discover_gpus()
    assert [g.uuid for g in inventory.gpus] == [gpu_uuid(0)] and inventory.unreadable == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [u.index for u in discover_gpus().unreadable] == [1]


def test_the_simulation_wins_over_nvml_and_says_so(nvml):
    inventory = discover_gpus(simulated="24,80", host="node1")
    assert inventory.source == "simulated" and all(g.simulated and "(simulated)" in g.name for g in inventory.gpus)
