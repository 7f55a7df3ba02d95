"""A worker's view of its GPU's memory through real pynvml (the NVML stand-in), and the model
cache refusing to load beside memory others hold."""

import pytest

from tests.nvml_standin import StandinProcess, gpu_uuid
from worker.engine import LoadedModel
from worker.gpu_memory import GpuMemory
from worker.model_cache import GpuBusy, ModelCache, ModelSpec

GPU = gpu_uuid(1)  # the stand-in's 23034 MiB GPU


def spec(name, vram_mib, model_path="", per_gpu_mib=None):
    return ModelSpec(name, model_path, 256, True, vram_mib, per_gpu_mib)


def test_a_model_fits_now_only_beside_what_others_hold(nvml):
    memory = GpuMemory((GPU,))
    assert memory.fits_now(spec("m", 20_000)) is None
    nvml.processes = [StandinProcess(GPU, pid=999, used_mib=8_000)]
    nvml.write()
    assert memory.fits_now(spec("m", 20_000)) == "busy: the model needs 20000 MiB, 15034 MiB are free"
    assert memory.held_by_others() == 8_000
    # Once this process holds a CUDA context, NVML counts it as used; the estimate already
    # does (457 MiB of overhead), so it is not counted twice.
    memory.cuda_started = True
    assert memory.held_by_others() == 8_000 - 457
    assert memory.fits_now(spec("m", 15_034 + 457)) is None


def test_without_nvml_nothing_is_judged(nvml, monkeypatch):
    monkeypatch.delenv("NVML_STANDIN_CONFIG")
    memory = GpuMemory((GPU,))
    assert memory.fits_now(spec("m", 10**9)) is None and memory.held_by_others() is None


def test_a_groups_split_sets_each_gpus_reserve_aside(nvml):
    nvml.processes = [StandinProcess(gpu_uuid(0), pid=999, used_mib=61_920)]  # 20000 MiB left of 81920
    nvml.write()
    memory = GpuMemory((gpu_uuid(0), GPU))
    split = memory.tensor_split(spec("m", 0, per_gpu_mib=3_000), [81_920, 23_034])
    assert split == [17_000.0, 20_034.0]  # free less 3000 each, not the totals' 78 : 22


def test_the_cache_unloads_its_own_models_first_then_refuses_to_load_beside_others(nvml, model_path):
    loads = []

    def load(s):
        loads.append(s.name)
        return LoadedModel(s.path, n_ctx=s.n_ctx, embedding=True, threads=1, gpu_layers=0)

    memory = GpuMemory((GPU,))
    cache = ModelCache(load, max_loaded=2, fits_now=memory.fits_now)
    small = spec("small", 1_000, model_path)
    cache.get(small)
    nvml.processes = [StandinProcess(GPU, pid=999, used_mib=20_000)]  # 3034 MiB left
    nvml.write()
    with pytest.raises(GpuBusy, match="out of memory before loading big: busy: the model needs 5000 MiB"):
        cache.get(spec("big", 5_000, model_path))
    assert cache.loaded_names() == []  # it unloaded its own model first, and still no room
    assert loads == ["small"]  # never tried the load that would have failed on the GPU
    cache.get(spec("fits", 3_000, model_path))
    assert cache.loaded_names() == ["fits"]
    cache.clear()
