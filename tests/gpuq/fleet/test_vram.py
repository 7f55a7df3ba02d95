"""VRAM estimates against figures computed by hand (the arithmetic is in the comments)."""

import pytest

from gpuq.fleet.vram import ModelShape, estimate_vram
from gpuq.registry.bundled import require_bundled_model_path
from gpuq.registry.gguf import read_metadata

MIB = 1 << 20

# Llama-2-7B Q4_0: 32 layers, 4096 wide, 32 heads (all KV), head size 128, vocab 32000.
LLAMA_7B = ModelShape(3_825_065_984, 32, 4096, 32, 32, 128, 128, 32_000)
# A Llama-3-70B Q4_K_M: 80 layers, 8192 wide, 64 heads, 8 KV heads (GQA), vocab 128256.
LLAMA_70B = ModelShape(42_520_395_776, 80, 8192, 64, 8, 128, 128, 128_256)

CASES = [
    # name, shape, n_ctx, weights MiB, KV MiB, compute MiB, total MiB
    # 7B @4096: KV = 32 layers * 4096 tok * 32 heads * (128+128) * 2 B = 2 GiB.
    #   compute = max(4*512*(1 + 4*4096 + 4096*33), 4*512*(4096+32000)) = 310,380,544 B = 296.0 MiB
    #   total = (3647.87 + 2048 + 296.0) * 1.05 + 256 = 6547.46 MiB
    ("7B", LLAMA_7B, 4096, 3647.87, 2048.0, 296.0, 6547.46),
    # 70B @8192: KV = 80 * 8192 * 8 * 256 * 2 B = 2560 MiB (GQA keeps it small).
    #   compute = max(4*512*(1 + 4*8192 + 8192*65), 4*512*(8192+128256)) = 1,157,629,952 B = 1104.0 MiB
    #   total = (40550.61 + 2560 + 1104.0) * 1.05 + 256 = 46681.34 MiB: too big for 24 GiB, fits 48 GiB.
    ("70B", LLAMA_70B, 8192, 40550.61, 2560.0, 1104.0, 46681.34),
]


@pytest.mark.parametrize(("name", "shape", "n_ctx", "weights", "kv", "compute", "total"), CASES)
def test_estimates_match_hand_computed_figures(name, shape, n_ctx, weights, kv, compute, total):
    estimate = estimate_vram(shape, n_ctx=n_ctx)
    assert estimate.weights_mib == pytest.approx(weights, abs=0.01)
    assert estimate.kv_cache_mib == pytest.approx(kv, abs=0.01)
    assert estimate.compute_mib == pytest.approx(compute, abs=0.01)
    assert estimate.total_mib == pytest.approx(total, abs=0.01)


def test_the_bundled_models_estimate_from_its_own_gguf_header():
    meta = read_metadata(require_bundled_model_path())
    # SmolLM2-135M: 30 layers, 576 wide, 9 heads, 3 KV heads of 64, vocab 49152, tensors 96,576,768 B.
    assert meta.shape == ModelShape(96_576_768, 30, 576, 9, 3, 64, 64, 49_152)
    estimate = estimate_vram(meta.shape, n_ctx=2048)
    # KV = 30 * 2048 * 3 * 128 * 2 B = 45 MiB; compute = 4*512*(576+49152) B = 97.125 MiB
    # (llama.cpp itself reports a 99.38 MiB compute buffer for this model and batch);
    # total = (92.10 + 45 + 97.125) * 1.05 + 256 = 501.94 MiB.
    assert (estimate.kv_cache_mib, estimate.compute_mib) == (45.0, 97.125)
    assert estimate.total_mib == pytest.approx(501.94, abs=0.01)


def test_the_kv_cache_grows_linearly_with_the_context():
    small, large = (estimate_vram(LLAMA_7B, n_ctx=n) for n in (2048, 8192))
    assert large.kv_cache_mib == 4 * small.kv_cache_mib
    assert large.weights_mib == small.weights_mib
