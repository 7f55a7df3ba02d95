"""How much GPU memory a model needs at a given context, estimated from GGUF metadata.

    total = (weights + KV cache + compute buffer) * (1 + margin) + per-GPU overhead

* weights: the bytes of the GGUF file's tensors, as they are loaded.
* KV cache: layers x context x KV heads x (key + value head size) x bytes per element
  (f16 by default, as llama.cpp allocates it).
* compute buffer: llama.cpp's graph scratch for one batch, with Ollama's estimate for
  llama-style graphs (``llm/memory.go``): the larger of the attention and the output
  projection buffers. For SmolLM2 at 2,048 tokens this gives 97.1 MiB where llama.cpp
  reports 99.4 MiB.
* margin and overhead: slack for what the formula misses, and the CUDA context and
  cuBLAS workspace every GPU pays once per process.

Pure functions: no file access here, see ``gguf_metadata.read_shape``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
F16_BYTES = 2
DEFAULT_BATCH = 512
DEFAULT_MARGIN = 0.05
DEFAULT_OVERHEAD_MIB = 256.0


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The GGUF facts an estimate needs."""

    weights_bytes: int
    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int  # per attention head
    value_length: int
    vocab_size: int


@dataclass(frozen=True, slots=True)
class VramEstimate:
    weights_mib: float
    kv_cache_mib: float
    compute_mib: float
    overhead_mib: float
    total_mib: float


def kv_cache_bytes(shape: ModelShape, n_ctx: int, bytes_per_element: int = F16_BYTES) -> int:
    per_token = shape.head_count_kv * (shape.key_length + shape.value_length) * bytes_per_element
    return shape.block_count * n_ctx * per_token


def compute_buffer_bytes(shape: ModelShape, n_ctx: int, n_batch: int = DEFAULT_BATCH) -> int:
    attention = 4 * n_batch * (1 + 4 * shape.embedding_length + n_ctx * (1 + shape.head_count))
    output = 4 * n_batch * (shape.embedding_length + shape.vocab_size)
    return max(attention, output)


def estimate_vram(
    shape: ModelShape,
    *,
    n_ctx: int,
    n_batch: int = DEFAULT_BATCH,
    margin: float = DEFAULT_MARGIN,
    overhead_mib: float = DEFAULT_OVERHEAD_MIB,
) -> VramEstimate:
    weights = shape.weights_bytes / MIB
    kv = kv_cache_bytes(shape, n_ctx) / MIB
    compute = compute_buffer_bytes(shape, n_ctx, n_batch) / MIB
    total = (weights + kv + compute) * (1 + margin) + overhead_mib
    return VramEstimate(weights, kv, compute, overhead_mib, total)
