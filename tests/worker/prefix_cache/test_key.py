"""What makes saved KV not fit: every part of the layout and the namespace keeps a start from
being found under another; and the RAM tier's default size."""

import dataclasses

import llama_cpp
import pytest

from tests.worker.prefix_cache.keys import LAYOUT, entry, start
from worker.prefix_cache.cache import AUTO_RAM_CAP_BYTES, GIB, PrefixCache, mem_available_bytes, ram_limit_bytes
from worker.prefix_cache.key import CacheKey, KvLayout

CHANGES = {
    "type_k": 8,  # q8_0 cells
    "type_v": 8,
    "kv_unified": True,
    "n_seq_max": 8,
    "n_ctx_seq": 2048,
    "flash_attn": False,
    "reuse": "whole-chunks",
    "chunk_tokens": 64,
    "gpu_layers": 99,
    "llama_version": "0.3.37",
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_a_start_saved_under_one_layout_is_not_found_under_another(field):
    assert set(CHANGES) == {f.name for f in dataclasses.fields(KvLayout)}  # every part is tried
    cache = PrefixCache(ram_limit_bytes=1 << 30)
    saved = entry(start(1, 100))
    cache.save(saved.key, saved.tokens, saved.data)
    other = CacheKey.of(saved.key.namespace, dataclasses.replace(LAYOUT, **{field: CHANGES[field]}))
    assert cache.lookup(saved.key, start(1, 100), limit=98) is not None
    assert cache.lookup(other, start(1, 100), limit=98) is None


def test_whole_chunk_reuse_takes_whole_chunks_of_a_saved_start_only():
    cache = PrefixCache(ram_limit_bytes=1 << 30)
    saved = entry(start(1, 150))
    cache.save(saved.key, saved.tokens, saved.data)
    assert cache.lookup(saved.key, start(1, 150), limit=149, unit=64).tokens == 128
    assert cache.lookup(saved.key, start(1, 100), limit=99, unit=64).tokens == 64
    assert cache.lookup(saved.key, start(1, 60) + [0] * 40, limit=99, unit=64) is None  # shares under a chunk


def test_the_layout_of_a_context_made_as_the_decoder_makes_it():
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = 4 * 1024, 4, False
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    layout = KvLayout.of_context(params, reuse="any-prefix", chunk_tokens=63, gpu_layers=0)
    assert (layout.n_seq_max, layout.n_ctx_seq, layout.kv_unified, layout.flash_attn) == (4, 1024, False, True)
    assert (layout.type_k, layout.type_v) == (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F16)
    assert layout.llama_version == llama_cpp.__version__
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    off = KvLayout.of_context(params, reuse="any-prefix", chunk_tokens=64, gpu_layers=0)
    assert not off.flash_attn and off.digest() != layout.digest()


@pytest.mark.parametrize(
    ("setting", "available", "workers", "expected"),
    [
        (0, 64 * GIB, 1, 0),  # off
        (3 * GIB, 64 * GIB, 4, 3 * GIB),  # as set, per worker
        (-1, 64 * GIB, 1, AUTO_RAM_CAP_BYTES),  # a quarter of 64 GiB, capped at 8 GiB
        (-1, 16 * GIB, 2, 2 * GIB),  # a quarter of 16 GiB shared by two workers
        (-1, None, 1, GIB),  # no MemAvailable (not Linux)
    ],
)
def test_the_ram_tiers_bound(setting, available, workers, expected):
    assert ram_limit_bytes(setting, available=available, workers=workers) == expected


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n")
    assert mem_available_bytes(meminfo) == 8_000_000 * 1024
    assert mem_available_bytes(tmp_path / "absent") is None
    assert mem_available_bytes() is not None  # this host's
