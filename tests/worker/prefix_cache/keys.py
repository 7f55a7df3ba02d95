"""Cache keys and saved starts for the tier tests (bytes stand in for llama.cpp's state: the
tiers never look inside them)."""

from __future__ import annotations

import hashlib

from worker.prefix_cache.entry import Entry
from worker.prefix_cache.key import CacheKey, KvLayout

LAYOUT = KvLayout(
    type_k=1,
    type_v=1,
    kv_unified=False,
    n_seq_max=4,
    n_ctx_seq=1024,
    flash_attn=True,
    reuse="any-prefix",
    chunk_tokens=63,
    gpu_layers=0,
    llama_version="0.3.36",
)
MODEL = hashlib.blake2b(b"smollm2", digest_size=16).digest()


def key(
    tenant: str | None = "acme", *, model: bytes = MODEL, layout: KvLayout = LAYOUT, shared: bool = False
) -> CacheKey:
    return CacheKey.for_job(model_fingerprint=model, owner=tenant, shared=shared, layout=layout)


def start(seed: int, length: int) -> list[int]:
    """``length`` tokens of family ``seed``."""
    return [seed * 1000 + i for i in range(length)]


def state(tokens: list[int], size: int = 4000) -> bytes:
    """Bytes standing for the cells of ``tokens``: distinct per start."""
    digest = hashlib.blake2b(repr(tokens).encode()).digest()
    return (digest * (size // len(digest) + 1))[:size]


def entry(tokens: list[int], cache_key: CacheKey | None = None, size: int = 4000) -> Entry:
    return Entry.make(cache_key or key(), tokens, state(tokens, size))
