"""How much GPU memory one llama.cpp context of a model needs, estimated from GGUF metadata.

    on one GPU:  (weights + KV cache) * (1 + margin) + per-GPU part
    on n GPUs:   (weights + KV cache) * (1 + margin) + n x per-GPU part
    per-GPU part = compute buffer * (1 + margin) + CUDA overhead

* weights: the bytes of the GGUF file's tensors, as they are loaded.
* KV cache: the sum over layers of KV heads x cells x (key + value head size) x bytes per
  element (f16, as llama.cpp allocates it); models whose layers differ in KV heads give one
  count per layer in their metadata. A context holds one KV stream per sequence, each of the
  sequence's context padded to 256 cells as llama.cpp pads it: a generation context of the
  worker holds K sequences (``GPUQ_WORKER_SLOTS``), an embedding context one (llama-cpp-python
  sets ``kv_unified`` for embeddings, so its parallel sequences share one stream of n_ctx).
  Weights and KV cache are split across the GPUs of a group (``tensor_split``).
* compute buffer: llama.cpp's graph scratch for one micro-batch, adapted from Ollama's
  estimate for llama-style graphs (``llm/memory.go``): the larger of the attention buffer
  (the KQ scores of one micro-batch against one sequence's cells, per head) and the output
  buffer (the logits of every token of the micro-batch). With separate KV streams the
  scores of K sequences add up to one sequence's, so K does not enter; the micro-batch
  does: 512 tokens for generation (``worker/decoding/decoder.py``), the whole context for
  embeddings (each text must fit one micro-batch for pooled embeddings). The output term
  also counts the f32 KQ mask (micro-batch x cells), which stays allocated while the
  logits are computed: without it the estimate fell 9 % short of what llama.cpp allocated
  for SmolLM2's embedding context at 4,096 tokens, with it every case measured is within
  2.5 % (see ``tests/gpuq/fleet/test_vram.py``). Every GPU of a group holding layers
  allocates its own, as Ollama counts it. Flash attention (the worker's default) does not
  hold the scores whole: at 2,048 tokens llama.cpp allocated 3 % more on the CPU, at 8,192
  tokens 41 % less, so the estimate holds near a small context and errs high on a long one.
* CUDA overhead: the CUDA context and cuBLAS workspace every GPU pays once per process,
  457 MiB (Ollama's ``MinimumMemory`` for CUDA devices); the margin covers what the
  formula misses.

Pure functions: no file access here, see ``gpuq.registry.gguf.read_metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
F16_BYTES = 2
F32_BYTES = 4
GENERATION_BATCH_TOKENS = 512  # n_batch = n_ubatch of the worker's generation contexts (worker/decoding/decoder.py)
KV_PAD_CELLS = 256  # llama.cpp rounds each sequence's KV stream up to a multiple of this
DEFAULT_MARGIN = 0.05
DEFAULT_OVERHEAD_MIB = 457.0  # per GPU: Ollama's MinimumMemory for CUDA (ml/device.go)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The GGUF facts an estimate needs."""

    weights_bytes: int
    block_count: int
    embedding_length: int
    head_count: int  # the largest, when layers differ
    head_count_kv: int | tuple[int, ...]  # per layer, when layers differ
    key_length: int  # per attention head
    value_length: int
    vocab_size: int


@dataclass(frozen=True, slots=True)
class VramEstimate:
    weights_mib: float
    kv_cache_mib: float
    compute_mib: float
    overhead_mib: float
    total_mib: float  # on one GPU
    n_seqs: int  # sequences with their own KV stream: K for generation, 1 for embeddings
    n_ctx: int  # tokens per sequence, as registered
    n_batch: int  # tokens per micro-batch
    margin: float = DEFAULT_MARGIN

    @property
    def per_gpu_mib(self) -> float:
        """What each GPU of a group pays again: its compute buffer and its CUDA overhead."""
        return self.compute_mib * (1 + self.margin) + self.overhead_mib

    def total_on(self, n_gpus: int) -> float:
        return self.total_mib + (n_gpus - 1) * self.per_gpu_mib


def on_gpus(total_mib: int, per_gpu_mib: int | None, n_gpus: int) -> int:
    """A figure for one GPU (an estimate or an admin's measure) carried to ``n_gpus``: each
    further GPU pays the per-GPU part again (without an estimate of it, the CUDA overhead)."""
    per_gpu = per_gpu_mib if per_gpu_mib is not None else int(DEFAULT_OVERHEAD_MIB)
    return total_mib + max(0, n_gpus - 1) * per_gpu


def tensor_split(free_mib: list[float], reserve_mib: float) -> list[float]:
    """llama.cpp's ``tensor_split`` for a group: layers in proportion to what each GPU has
    left once its own compute buffer and CUDA overhead (``reserve_mib``) are set aside, so a
    GPU with little free memory is not handed the share its size alone would suggest."""
    room = [max(0.0, free - reserve_mib) for free in free_mib]
    if not any(room):
        return [1.0] * len(free_mib)
    return room


def padded_cells(n_ctx: int) -> int:
    return -(-n_ctx // KV_PAD_CELLS) * KV_PAD_CELLS


def kv_heads_over_layers(shape: ModelShape) -> int:
    """KV heads summed over the layers (each layer's own count, where they differ)."""
    if isinstance(shape.head_count_kv, tuple):
        return sum(shape.head_count_kv)
    return shape.block_count * shape.head_count_kv


def kv_cache_bytes(shape: ModelShape, n_cells: int, bytes_per_element: int = F16_BYTES) -> int:
    per_head_token = (shape.key_length + shape.value_length) * bytes_per_element
    return kv_heads_over_layers(shape) * n_cells * per_head_token


def compute_buffer_bytes(shape: ModelShape, n_ctx: int, n_batch: int = GENERATION_BATCH_TOKENS) -> int:
    """``n_ctx`` is the cells one sequence attends over (its own stream), ``n_batch`` the micro-batch."""
    attention = F32_BYTES * n_batch * (1 + 4 * shape.embedding_length + n_ctx * (1 + shape.head_count))
    output = F32_BYTES * n_batch * (shape.embedding_length + shape.vocab_size + n_ctx)
    return max(attention, output)


def estimate_vram(
    shape: ModelShape,
    *,
    n_ctx: int,
    n_seqs: int = 1,
    n_batch: int = GENERATION_BATCH_TOKENS,
    margin: float = DEFAULT_MARGIN,
    overhead_mib: float = DEFAULT_OVERHEAD_MIB,
) -> VramEstimate:
    """One context of ``n_seqs`` sequences of ``n_ctx`` tokens each, decoding ``n_batch`` tokens at a time."""
    cells_per_seq = padded_cells(n_ctx)
    # llama.cpp caps a causal context's batch at its (unpadded) size.
    n_batch = min(n_batch, n_ctx * n_seqs)
    weights = shape.weights_bytes / MIB
    kv = kv_cache_bytes(shape, n_seqs * cells_per_seq) / MIB
    compute = compute_buffer_bytes(shape, cells_per_seq, n_batch) / MIB
    total = (weights + kv + compute) * (1 + margin) + overhead_mib
    return VramEstimate(weights, kv, compute, overhead_mib, total, n_seqs, n_ctx, n_batch, margin)


def estimate_generation(shape: ModelShape, *, n_ctx: int, slots: int) -> VramEstimate:
    """A worker's generation context: ``slots`` (K) sequences of ``n_ctx`` tokens, 512-token batches."""
    return estimate_vram(shape, n_ctx=n_ctx, n_seqs=slots, n_batch=GENERATION_BATCH_TOKENS)


def estimate_embedding(shape: ModelShape, *, n_ctx: int) -> VramEstimate:
    """A worker's embedding context: one KV stream of ``n_ctx`` and a micro-batch of ``n_ctx`` tokens."""
    return estimate_vram(shape, n_ctx=n_ctx, n_seqs=1, n_batch=n_ctx)
