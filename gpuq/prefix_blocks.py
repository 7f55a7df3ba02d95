"""A prompt's start as a chain of block hashes, the same in the API and in every worker.

The prefix cache (``worker/prefix_cache/``) finds a saved KV state by the longest start a new
prompt shares with it, and the fleet's prefix index (issue 42) routes a job to the worker whose
cache holds its start. Both name a start the same way: the prompt's token ids cut in blocks of
``BLOCK_TOKENS`` from position 0, block ``i``'s hash ``H(hash(i - 1), tokens of block i)``,
so a block's hash names the whole start up to its end, and two prompts share the hashes of
exactly the whole blocks they share. A last partial block is not hashed (the cache compares
its tokens one by one).

The chain starts from a **namespace** salt: the model file's fingerprint and the cache scope
(the tenant, or one scope for all tenants when an admin shares a model's cache), so one tenant's
hashes say nothing about another's prompts, and a chain of one model never names a start of
another. Everything here is plain bytes and BLAKE2b (never Python's ``hash()``, which is salted
per process), so a hash the API computes is the hash a worker published.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from functools import lru_cache

BLOCK_TOKENS = 16  # as vLLM's and llm-d's blocks: fine enough that a partial tail stays short
DIGEST_BYTES = 16
# In the salt: a change of the scheme (block size, hash, token encoding) never matches old hashes.
SCHEME = b"gpuq-prefix-blocks/1"
SHARED_SCOPE = "*"  # GPUQ_WORKER_PREFIX_CACHE_SHARED_TENANTS: one scope for every tenant
FINGERPRINT_WINDOWS = 64  # windows of the model file read for its fingerprint
FINGERPRINT_WINDOW_BYTES = 64 * 1024


def cache_scope(owner: str | None, *, shared: bool) -> str:
    """The scope a job's cached starts live in: its tenant's own (``owner``; None, a job with no
    owner, is one tenant of its own), or the one shared by every tenant when an admin shares
    the model's cache (``GPUQ_WORKER_PREFIX_CACHE_SHARED_TENANTS``)."""
    if shared:
        return SHARED_SCOPE
    return "tenant:" if owner is None else f"tenant:{owner}"


def namespace_salt(model_fingerprint: bytes, scope: str) -> bytes:
    """The chain's start: a model file and a cache scope."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in (SCHEME, struct.pack("<I", BLOCK_TOKENS), model_fingerprint, scope.encode()):
        h.update(struct.pack("<I", len(part)))  # lengths first: no two part lists give one byte string
        h.update(part)
    return h.digest()


def block_hashes(tokens: Sequence[int], salt: bytes) -> list[bytes]:
    """The hashes of the prompt's whole blocks, in order: element ``i`` names tokens
    ``[0, (i + 1) * BLOCK_TOKENS)`` under ``salt``."""
    whole = len(tokens) // BLOCK_TOKENS * BLOCK_TOKENS
    packed = struct.pack(f"<{whole}i", *tokens[:whole])
    step = BLOCK_TOKENS * 4
    chain: list[bytes] = []
    previous = salt
    for start in range(0, len(packed), step):
        previous = hashlib.blake2b(previous + packed[start : start + step], digest_size=DIGEST_BYTES).digest()
        chain.append(previous)
    return chain


def model_fingerprint(path: str) -> bytes:
    """A model file's identity, read the same on every host that has the same file: its size
    and ``FINGERPRINT_WINDOWS`` windows of 64 KiB spread evenly over it (the GGUF header at the
    start, weights in every stretch after it; 4 MiB read, milliseconds from the page cache).
    Any other model, a re-quantised file or a fine-tune of the same shape, differs in its
    weights everywhere and so in these windows. Not a checksum of every byte: a file changed
    only between the windows keeps its fingerprint. Remembered per (path, size, mtime)."""
    stat = os.stat(path)
    return _fingerprint(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _fingerprint(path: str, size: int, _mtime_ns: int) -> bytes:
    h = hashlib.blake2b(struct.pack("<Q", size), digest_size=DIGEST_BYTES)
    span = max(0, size - FINGERPRINT_WINDOW_BYTES)
    with open(path, "rb") as f:
        for i in range(FINGERPRINT_WINDOWS):
            f.seek(span * i // max(1, FINGERPRINT_WINDOWS - 1))
            h.update(f.read(FINGERPRINT_WINDOW_BYTES))
    return h.digest()
