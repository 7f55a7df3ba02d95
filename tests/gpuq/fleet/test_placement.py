"""Placement beyond the affinity rules: groups paying per-GPU reserves, health, MIG devices,
free memory known or unknown, and the split of a group's layers."""

import pytest

from gpuq.db.tables import Gpu
from gpuq.fleet.affinity import GpuTarget
from gpuq.fleet.placement import (
    Candidate,
    FitsFreeMemoryFilter,
    PlacementRequest,
    evaluate,
    group_for,
    may_serve,
)
from gpuq.fleet.snapshot import load_fleet
from gpuq.fleet.vram import ModelShape, estimate_embedding, on_gpus, tensor_split

GIB = 1024
# An 8B like Llama-3-8B Q4_K_M (tests/gpuq/fleet/test_vram.py): its embedding context at
# 8,192 tokens has a 8.75 GiB compute buffer, which every GPU of a group allocates.
LLAMA_8B = ModelShape(4_920_734_720, 32, 4096, 32, 8, 128, 128, 128_256)


def gpus(*sizes_gib, host="node1", unhealthy=(), mig=()):
    return [
        Candidate(
            GpuTarget(f"MIG-{i}" if i in mig else f"GPU-{i}", i, f"Test {s}G", host, s * GIB),
            None,
            healthy=i not in unhealthy,
        )
        for i, s in enumerate(sizes_gib)
    ]


def test_each_gpu_of_a_group_pays_its_own_compute_buffer_and_cuda_overhead():
    estimate = estimate_embedding(LLAMA_8B, n_ctx=8192)
    # One GPU: (4692.8 weights + 1024 KV + 8960.0 compute) * 1.05 + 457 = 15867.65 MiB.
    # Each further GPU: 8960.0 * 1.05 + 457 = 9865.03 MiB more (Ollama counts the graph per GPU).
    assert estimate.per_gpu_mib == pytest.approx(9865.03, abs=0.01)
    assert estimate.total_on(2) == pytest.approx(15867.65 + 9865.03, abs=0.02)
    request = PlacementRequest("llama-8b", "embed", 15_868, per_gpu_mib=9_866)
    # Two 12 GiB GPUs hold 24576 MiB, more than the one-GPU figure but less than the
    # 25734 MiB two GPUs really need: a third GPU joins.
    group = group_for(request, gpus(12, 12, 12), [])
    assert [g.target.index for g in group] == [0, 1, 2]
    # Counted once, as before, two GPUs would have been chosen and run out of memory.
    assert group_for(PlacementRequest("llama-8b", "embed", 15_868, per_gpu_mib=0), gpus(12, 12, 12), []) != group


def test_a_figure_without_a_per_gpu_part_adds_the_cuda_overhead_per_further_gpu():
    assert on_gpus(10_000, None, 1) == 10_000
    assert on_gpus(10_000, None, 3) == 10_000 + 2 * 457
    assert on_gpus(10_000, 1_500, 2) == 11_500


def test_unhealthy_gpus_and_mig_devices_never_join_a_group():
    request = PlacementRequest("big", "generate", 60 * GIB)
    assert [g.target.index for g in group_for(request, gpus(48, 24, 48), [])] == [0, 2]
    assert [g.target.index for g in group_for(request, gpus(48, 24, 48, unhealthy={2}), [])] == [0, 1]
    # A CUDA process can use one MIG device only: a group of MIG devices cannot exist.
    assert group_for(request, gpus(40, 40, mig={0, 1}), []) == ()
    # A single healthy GPU that holds it means no group; an unhealthy one does not count.
    assert group_for(request, gpus(80, 48, 48), []) == ()
    assert [g.target.index for g in group_for(request, gpus(80, 48, 48, unhealthy={0}), [])] == [1, 2]


def test_what_a_gpu_serves_depends_on_its_health():
    request = PlacementRequest("m", "generate", 1000)
    healthy, sick = gpus(24, 24, unhealthy={1})
    verdicts = evaluate(request, [healthy, sick], may_serve([]))
    assert [v.ok for v in verdicts] == [True, False]
    assert verdicts[1].reasons == ["marked unhealthy by an admin or after repeated errors"]


def test_free_memory_is_judged_only_on_a_reading():
    target = GpuTarget("GPU-0", 0, "Test", "node1", 24 * GIB)
    request = PlacementRequest("m", "generate", 10 * GIB)
    fits = FitsFreeMemoryFilter()
    assert fits.reject(request, Candidate(target, None)) is None  # unknown: the load finds out
    assert fits.reject(request, Candidate(target, 12 * GIB)) is None
    assert fits.reject(request, Candidate(target, 4 * GIB)) == "busy: the model needs 10240 MiB, 4096 MiB are free"
    assert fits.reject(request, Candidate(target, 4 * GIB, loaded_models=frozenset({"m"}))) is None


def test_the_fleet_from_sql_never_passes_total_memory_as_free(session):
    session.add(Gpu(uuid="GPU-0", host="node1", index=0, name="Test", memory_total_mib=24 * GIB, simulated=False))
    session.commit()
    [unknown] = load_fleet(session).gpus
    assert unknown.memory_free_mib is None
    [read] = load_fleet(session, free_mib={"GPU-0": 5000}).gpus
    assert read.memory_free_mib == 5000


def test_a_groups_layers_are_split_by_what_each_gpu_has_left_after_its_reserve():
    # 20 and 10 GiB free, 4 GiB reserved on each: 16 : 6, not 20 : 10.
    assert tensor_split([20 * GIB, 10 * GIB], 4 * GIB) == [16 * GIB, 6 * GIB]
    assert tensor_split([3 * GIB, 30 * GIB], 4 * GIB) == [0.0, 26 * GIB]  # too full to hold a layer
    assert tensor_split([1, 2], 4 * GIB) == [1.0, 1.0]  # nothing known to be left: even
