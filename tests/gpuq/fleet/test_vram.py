"""VRAM estimates against figures computed by hand (the arithmetic is in the comments) and
against what llama.cpp itself allocates for the bundled model on the CPU."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.db.tables import ModelKind
from gpuq.fleet.vram import ModelShape, estimate_embedding, estimate_generation, estimate_vram
from gpuq.registry.bundled import require_bundled_model_path
from gpuq.registry.gguf import read_metadata
from gpuq.registry.models import build_model, estimate_for_kinds, vram_basis

MIB = 1 << 20

# Llama-2-7B Q4_0: 32 layers, 4096 wide, 32 heads (all KV), head size 128, vocab 32000.
LLAMA_7B = ModelShape(3_825_065_984, 32, 4096, 32, 32, 128, 128, 32_000)
# A Llama-3-70B Q4_K_M: 80 layers, 8192 wide, 64 heads, 8 KV heads (GQA), vocab 128256.
LLAMA_70B = ModelShape(42_520_395_776, 80, 8192, 64, 8, 128, 128, 128_256)
# An 8B like Llama-3-8B Q4_K_M: 32 layers, 4096 wide, 32 heads, 8 KV heads, vocab 128256, 4.58 GiB of tensors.
LLAMA_8B = ModelShape(4_920_734_720, 32, 4096, 32, 8, 128, 128, 128_256)
# SmolLM2-135M, the bundled model, as its GGUF header says (checked below): 30 layers, 576 wide,
# 9 heads, 3 KV heads of 64, vocab 49152, 96,576,768 B of tensors (92.10 MiB).
SMOLLM2 = ModelShape(96_576_768, 30, 576, 9, 3, 64, 64, 49_152)

CASES = [
    # name, shape, n_ctx, weights MiB, KV MiB, compute MiB, total MiB (one sequence, 512-token batches)
    # 7B @4096: KV = 32 layers * 4096 tok * 32 heads * (128+128) * 2 B = 2 GiB.
    #   compute = max(4*512*(1 + 4*4096 + 4096*33), 4*512*(4096+32000+4096)) = 310,380,544 B = 296.0 MiB
    #   total = (3647.87 + 2048 + 296.0) * 1.05 + 457 = 6748.46 MiB
    ("7B", LLAMA_7B, 4096, 3647.87, 2048.0, 296.0, 6748.46),
    # 70B @8192: KV = 80 * 8192 * 8 * 256 * 2 B = 2560 MiB (GQA keeps it small).
    #   compute = max(4*512*(1 + 4*8192 + 8192*65), 4*512*(8192+128256+8192)) = 1,157,629,952 B = 1104.0 MiB
    #   total = (40550.61 + 2560 + 1104.0) * 1.05 + 457 = 46882.34 MiB: too big for 24 GiB, fits 48 GiB.
    ("70B", LLAMA_70B, 8192, 40550.61, 2560.0, 1104.0, 46882.34),
]


@pytest.mark.parametrize(("name", "shape", "n_ctx", "weights", "kv", "compute", "total"), CASES)
def test_estimates_match_hand_computed_figures(name, shape, n_ctx, weights, kv, compute, total):
    estimate = estimate_vram(shape, n_ctx=n_ctx)
    assert estimate.weights_mib == pytest.approx(weights, abs=0.01)
    assert estimate.kv_cache_mib == pytest.approx(kv, abs=0.01)
    assert estimate.compute_mib == pytest.approx(compute, abs=0.01)
    assert estimate.total_mib == pytest.approx(total, abs=0.01)


CONTEXTS = [
    # name, estimate, KV MiB, compute MiB, total MiB; total = (weights + KV + compute) * 1.05 + 457 (CUDA overhead).
    # SmolLM2 @2048, generation: KV = 30 layers * 3 KV heads * 128 * 2 B = 22.5 KiB a cell, 45 MiB a sequence.
    #   compute = max(4*512*(1 + 4*576 + 2048*10), 4*512*(576 + 49152 + 2048)) = 4*512*51776 B = 101.125 MiB,
    #   the same for any K: each sequence's scores are against its own 2048 cells.
    ("SmolLM2 K=1", estimate_generation(SMOLLM2, n_ctx=2048, slots=1), 45.0, 101.125, 707.14),
    ("SmolLM2 K=4", estimate_generation(SMOLLM2, n_ctx=2048, slots=4), 180.0, 101.125, 848.89),
    ("SmolLM2 K=8", estimate_generation(SMOLLM2, n_ctx=2048, slots=8), 360.0, 101.125, 1037.89),
    # SmolLM2 @2048, embeddings: one stream of 2048 cells, batches of 2048 tokens:
    #   compute = max(4*2048*(1 + 2304 + 2048*10), 4*2048*(576 + 49152 + 2048)) = 404.5 MiB (the logits win).
    ("SmolLM2 embed", estimate_embedding(SMOLLM2, n_ctx=2048), 45.0, 404.5, 1025.68),
    # SmolLM2 @100, K=3: each stream is padded to 256 cells (768 in all, 16.875 MiB) and the batch is
    #   capped at the 300 tokens of the context: compute = 4*300*(576 + 49152 + 256) = 57.20 MiB.
    ("SmolLM2 K=3 @100", estimate_generation(SMOLLM2, n_ctx=100, slots=3), 16.875, 57.20, 631.49),
    # 8B @8192: KV = 32 layers * 8 KV heads * 256 * 2 B = 128 KiB a cell, 1 GiB a sequence.
    #   compute = max(4*512*(1 + 4*4096 + 8192*33), 4*512*(4096 + 128256 + 8192)) = 560.0 MiB for any K.
    ("8B K=1", estimate_generation(LLAMA_8B, n_ctx=8192, slots=1), 1024.0, 560.0, 7047.62),
    #   K=8: the KV cache is 8 GiB, the total more than doubles.
    ("8B K=8", estimate_generation(LLAMA_8B, n_ctx=8192, slots=8), 8192.0, 560.0, 14574.02),
    # 8B @8192, embeddings: batches of 8192 tokens, so the attention scores of the whole context at once:
    #   compute = 4*8192*(1 + 4*4096 + 8192*33) = 8960.0 MiB, 16 times the generation context's.
    ("8B embed", estimate_embedding(LLAMA_8B, n_ctx=8192), 1024.0, 8960.03, 15867.65),
]


@pytest.mark.parametrize(("name", "estimate", "kv", "compute", "total"), CONTEXTS, ids=[c[0] for c in CONTEXTS])
def test_generation_counts_k_sequences_and_embeddings_a_whole_context_batch(name, estimate, kv, compute, total):
    assert estimate.kv_cache_mib == pytest.approx(kv, abs=0.01)
    assert estimate.compute_mib == pytest.approx(compute, abs=0.01)
    assert estimate.total_mib == pytest.approx(total, abs=0.01)


def test_k_scales_the_kv_cache_and_nothing_else():
    one, eight = (estimate_generation(LLAMA_8B, n_ctx=8192, slots=k) for k in (1, 8))
    assert eight.kv_cache_mib == 8 * one.kv_cache_mib
    assert (eight.weights_mib, eight.compute_mib) == (one.weights_mib, one.compute_mib)
    assert (eight.n_seqs, eight.n_batch) == (8, 512)


def test_the_bundled_models_estimate_from_its_own_gguf_header():
    meta = read_metadata(require_bundled_model_path())
    assert meta.shape == SMOLLM2
    # Generate and embed: the larger context decides, here generation with 8 sequences (1037.89 MiB)
    # over embeddings (1025.68 MiB); with 4 sequences (848.89 MiB) the embedding context is larger.
    both = {ModelKind.GENERATE, ModelKind.EMBED}
    assert estimate_for_kinds(meta.shape, n_ctx=2048, kinds=both, slots=8).n_seqs == 8
    assert estimate_for_kinds(meta.shape, n_ctx=2048, kinds=both, slots=4).n_batch == 2048


def test_registration_stores_the_figure_for_k_and_an_admins_measure_wins():
    path = require_bundled_model_path()
    both = {ModelKind.GENERATE, ModelKind.EMBED}
    model = build_model(name="m", path=path, kinds=both, context_length=2048, slots=8)
    assert model.vram_estimate_mib == 1038 and model.vram_mib == 1038
    assert vram_basis(model, 8) == (
        "estimate for generation with K=8 sequences of 2048 tokens or embeddings in 2048-token batches, "
        "whichever needs more"
    )
    embed_only = build_model(name="m", path=path, kinds={ModelKind.EMBED}, context_length=2048, slots=8)
    assert embed_only.vram_estimate_mib == 1026  # K does not enter
    measured = build_model(name="m", path=path, kinds=both, context_length=2048, vram_override_mib=600, slots=8)
    assert (measured.vram_estimate_mib, measured.vram_mib) == (1038, 600)
    assert vram_basis(measured, 8) == "measured by an admin"


# Builds the worker's two kinds of context for SmolLM2 with llama.cpp's logging on, in a
# process of its own (the logging switch is global), and prints what llama.cpp allocated.
MEASURE = """
import json, sys
import llama_cpp
from llama_cpp._internals import LlamaContext, LlamaModel

path, slots, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = LlamaModel(path_model=path, params=llama_cpp.llama_model_default_params(), verbose=True)
params = llama_cpp.llama_context_default_params()  # as worker/decoding/decoder.py sets them
params.n_ctx, params.n_seq_max, params.kv_unified = n_ctx * slots, slots, False
params.n_batch = params.n_ubatch = 512
params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO  # the worker's default: on
LlamaContext(model=model, params=params, verbose=True).close()
print("@@ embed", file=sys.stderr, flush=True)
llama_cpp.Llama(  # as worker/engine.py's _embedding_llama sets it
    model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, embedding=True, verbose=True,
    pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=1,
).close()
"""


def _allocated_mib(log: str) -> tuple[float, float]:
    kv = re.search(r"KV buffer size =\s*([\d.]+) MiB", log)
    compute = re.search(r"compute buffer size =\s*([\d.]+) MiB", log)
    assert kv is not None and compute is not None, "llama.cpp's log names both buffers"
    return float(kv.group(1)), float(compute.group(1))


def test_the_estimate_matches_what_llama_cpp_allocates_for_smollm2():
    """llama-cpp-python 0.3.36, CPU, SmolLM2 at 2,048 tokens, measured here:

    * generation, K=4, flash attention on (the worker's default): KV 180.00 MiB (estimate
      180.00, ratio 1.000), compute 102.51 MiB (estimate 101.125, 0.986); weights + KV +
      compute 374.61 MiB against 373.23 (0.996). K=1 and K=8 give the same compute buffer and
      45 / 360 MiB of KV, as estimated. Flash attention off: compute 99.38 MiB (1.018).
    * embeddings: KV 45.00 MiB (1.000), compute 414.04 MiB (estimate 404.5, 0.977);
      weights + KV + compute 551.14 MiB against 541.60 (0.983), which the 5 % margin covers.
    * elsewhere, estimate / allocated compute: generation K=4 at 8,192 tokens 164.50 / 166.38
      with flash attention off (0.989), 164.50 / 98.25 with it on (the estimate errs high);
      embeddings at 512, 4,096 and 8,192 tokens 0.976, 0.988, 0.986 (Ollama's formula without
      the mask term: 0.966, 0.913, 0.986).
    """
    path = str(require_bundled_model_path())
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, path, "4", "2048"], capture_output=True, text=True, timeout=120, check=True
    )
    generation_log, embedding_log = done.stderr.split("@@ embed")
    measured = {"generate": _allocated_mib(generation_log), "embed": _allocated_mib(embedding_log)}
    estimated = {
        "generate": estimate_generation(SMOLLM2, n_ctx=2048, slots=4),
        "embed": estimate_embedding(SMOLLM2, n_ctx=2048),
    }
    for kind, (kv_mib, compute_mib) in measured.items():
        estimate = estimated[kind]
        assert estimate.kv_cache_mib == kv_mib, json.dumps(measured)
        assert 0.97 <= estimate.compute_mib / compute_mib <= 1.03, json.dumps(measured)


def test_the_estimate_matches_what_llama_cpp_allocates_for_gemma3(second_model_path):
    """The second architecture: Gemma 3 270M interleaves sliding-window layers, for which
    llama.cpp keeps a second KV cache (at full size: ``swa_full``, llama-cpp-python's default),
    and has a 262,144-token vocabulary, so its compute buffers are the larger part. Measured
    here at 2,048 tokens, K=4: KV 24 + 120 MiB (estimate 144.0, exact), compute 514.50 MiB
    (estimate 517.25, 1.005); embeddings: KV 6 + 30 MiB (36.0), compute 2,095.05 MiB (2,069.0,
    0.988)."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, second_model_path, "4", "2048"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    shape = read_metadata(Path(second_model_path)).shape
    generation_log, embedding_log = done.stderr.split("@@ embed")
    for log, estimate in (
        (generation_log, estimate_generation(shape, n_ctx=2048, slots=4)),
        (embedding_log, estimate_embedding(shape, n_ctx=2048)),
    ):
        kv_buffers = [float(mib) for mib in re.findall(r"KV buffer size =\s*([\d.]+) MiB", log)]
        _kv, compute_mib = _allocated_mib(log)
        assert len(kv_buffers) == 2 and estimate.kv_cache_mib == sum(kv_buffers), log[-2000:]
        assert 0.97 <= estimate.compute_mib / compute_mib <= 1.03, (estimate, compute_mib)
