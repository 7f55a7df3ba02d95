"""What makes saved KV fit a context: the cache key an entry is stored and found under.

Two parts. The **namespace** (``gpuq.prefix_blocks.namespace_salt``: the model file's
fingerprint and the cache scope, the tenant unless an admin shares the model's cache) is what
the API knows too: it salts the block-hash chain that the fleet's prefix index will publish.
The **layout** is the worker's own: what else changes the bytes or which cells are exact.

- ``type_k``/``type_v``: the KV cells' types (llama.cpp's ggml type ids);
- ``kv_unified`` and ``n_seq_max``: llama.cpp's sequence state counts the context's streams and
  refuses another count;
- ``n_ctx_seq``: cells per stream;
- ``flash_attn``, ``reuse`` (``any-prefix`` or ``whole-chunks``) and ``chunk_tokens``: which
  cells were computed the way a new prompt would compute them (docs/architecture.md,
  "Prompts evaluated once" and "Any common prefix");
- ``gpu_layers``: the backend whose kernels computed the cells (the CPU's and CUDA's round
  differently, so a start saved by a CPU worker is not exact on a GPU);
- ``llama_version``: the state format and the kernels of one llama-cpp-python build.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from gpuq.prefix_blocks import DIGEST_BYTES, cache_scope, namespace_salt


@dataclass(frozen=True, slots=True)
class KvLayout:
    type_k: int
    type_v: int
    kv_unified: bool
    n_seq_max: int
    n_ctx_seq: int
    flash_attn: bool
    reuse: str  # "any-prefix" or "whole-chunks"
    chunk_tokens: int
    gpu_layers: int
    llama_version: str

    @classmethod
    def of_context(cls, params: Any, *, reuse: str, chunk_tokens: int, gpu_layers: int) -> KvLayout:
        """The layout of a context made with ``params`` (``llama_context_params``)."""
        import llama_cpp

        return cls(
            type_k=int(params.type_k),
            type_v=int(params.type_v),
            kv_unified=bool(params.kv_unified),
            n_seq_max=int(params.n_seq_max),
            n_ctx_seq=int(params.n_ctx) // max(1, int(params.n_seq_max)),
            flash_attn=int(params.flash_attn_type) != llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
            reuse=reuse,
            chunk_tokens=chunk_tokens,
            gpu_layers=gpu_layers,
            llama_version=llama_cpp.__version__,
        )

    def digest(self) -> bytes:
        text = "\0".join(f"{name}={value}" for name, value in sorted(asdict(self).items()))
        return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class CacheKey:
    """The namespace salt (model fingerprint and scope) and the layout's digest, 16 bytes each."""

    namespace: bytes
    layout: bytes

    @classmethod
    def of(cls, namespace: bytes, layout: KvLayout) -> CacheKey:
        return cls(namespace, layout.digest())

    @classmethod
    def for_job(cls, *, model_fingerprint: bytes, owner: str | None, shared: bool, layout: KvLayout) -> CacheKey:
        """A job's key: its model file, its tenant (``jobs.owner``) unless the cache is shared
        (``GPUQ_WORKER_PREFIX_CACHE_SHARED_TENANTS``), and the context's layout."""
        return cls.of(namespace_salt(model_fingerprint, cache_scope(owner, shared=shared)), layout)

    @property
    def raw(self) -> bytes:
        return self.namespace + self.layout
