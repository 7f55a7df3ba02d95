"""Reading GGUF headers: per-layer counts, and files that are truncated or corrupt."""

import numpy as np
import pytest
from gguf import GGUFWriter

from gpuq.fleet.vram import ModelShape, estimate_vram, kv_cache_bytes
from gpuq.registry.gguf import NotAGgufFile, read_metadata

# An OpenELM-like model: 4 layers whose KV heads differ per layer (3, 3, 4, 5).
KV_HEADS = [3, 3, 4, 5]


def write_gguf(path, *, head_count_kv, head_count=8, with_required=True):
    writer = GGUFWriter(str(path), "openelm")
    writer.add_name("tiny per-layer")
    writer.add_context_length(2048)
    if with_required:
        writer.add_block_count(len(KV_HEADS))
        writer.add_embedding_length(512)
    writer.add_head_count(head_count)
    writer.add_array("openelm.attention.head_count_kv", head_count_kv)
    writer.add_key_length(64)
    writer.add_value_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((16, 512), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_per_layer_kv_heads_are_read_per_layer_and_summed_by_the_kv_estimate(tmp_path):
    path = tmp_path / "per-layer.gguf"
    write_gguf(path, head_count_kv=KV_HEADS)
    meta = read_metadata(path)
    assert (meta.architecture, meta.block_count, meta.head_count_kv) == ("openelm", 4, (3, 3, 4, 5))
    assert meta.weights_bytes == 16 * 512 * 4
    # 15 KV heads over the layers x 256 cells x (64 + 64) x 2 B.
    assert kv_cache_bytes(meta.shape, 256) == 15 * 256 * 128 * 2
    estimate = estimate_vram(meta.shape, n_ctx=256)
    assert estimate.kv_cache_mib == pytest.approx(15 * 256 * 128 * 2 / 2**20)


def test_a_per_layer_array_of_one_value_is_that_value(tmp_path):
    path = tmp_path / "uniform.gguf"
    write_gguf(path, head_count_kv=[4, 4, 4, 4])
    assert read_metadata(path).head_count_kv == 4
    uniform = ModelShape(0, 4, 512, 8, 4, 64, 64, 0)
    assert kv_cache_bytes(uniform, 256) == kv_cache_bytes(read_metadata(path).shape, 256)


@pytest.fixture
def damaged(tmp_path):
    """A small GGUF file (header, metadata, one 32 KiB tensor) damaged in each way: as a cut
    model file would be, without parsing the bundled model's 49,152-entry vocabulary each time."""
    whole_path = tmp_path / "whole.gguf"
    write_gguf(whole_path, head_count_kv=KV_HEADS)
    whole = whole_path.read_bytes()
    variants = {
        "magic only": whole[:4],
        "cut in its metadata": whole[:200],
        "last bytes missing": whole[:-100],  # the tensor's data ends early
        "garbage after the magic": b"GGUF" + bytes(range(256)) * 20,
    }
    paths = {}
    for name, blob in variants.items():
        paths[name] = tmp_path / f"{name.replace(' ', '-')}.gguf"
        paths[name].write_bytes(blob)
    return paths


def test_truncated_or_corrupt_files_are_refused_with_a_sentence_not_the_parsers_exception(damaged):
    for name, path in damaged.items():
        with pytest.raises(NotAGgufFile) as refused:
            read_metadata(path)
        assert "cannot be read as GGUF: it is truncated or corrupt" in str(refused.value), name


def test_a_header_without_the_counts_an_estimate_needs_is_refused(tmp_path):
    path = tmp_path / "headless.gguf"
    write_gguf(path, head_count_kv=KV_HEADS, with_required=False)
    with pytest.raises(NotAGgufFile, match=r"lacks GGUF metadata an estimate needs: openelm\.block_count"):
        read_metadata(path)
