"""A saved start (its tokens and llama.cpp's bytes for their cells) and the index that finds the
one sharing the longest start with a prompt.

The index maps each whole block's chain hash (``gpuq.prefix_blocks``) to the entries whose
tokens begin with that block chain: the prompt's chain is walked from the start while some
entry holds it, and among the entries at the deepest block reached, the one whose tokens go on
matching the prompt furthest (a partial block compared token by token) wins; the most recently
used wins a tie. A lookup costs one dictionary probe per block of the prompt, whatever the
number of entries.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuq.prefix_blocks import BLOCK_TOKENS, block_hashes
from worker.prefix_cache.key import CacheKey

Id = TypeVar("Id", bound=Hashable)
ENTRY_OVERHEAD_BYTES = 256  # what an entry costs beside its data and tokens (objects, index), for the bound


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """``tokens``: the prompt tokens whose cells ``data`` holds, positions ``[0, len(tokens))``,
    every one reusable."""

    key: CacheKey
    tokens: tuple[int, ...]
    data: bytes
    chain: tuple[bytes, ...] = field(default=())

    @classmethod
    def make(cls, key: CacheKey, tokens: Sequence[int], data: bytes) -> Entry:
        return cls(key, tuple(tokens), data, tuple(block_hashes(tokens, key.namespace)))

    @property
    def size(self) -> int:
        return len(self.data) + 4 * len(self.tokens) + ENTRY_OVERHEAD_BYTES


def indexable(tokens: Sequence[int]) -> bool:
    """A start shorter than one block is never kept: it cannot be found (and is cheap to compute)."""
    return len(tokens) >= BLOCK_TOKENS


def shared_tokens(a: Sequence[int], b: Sequence[int], start: int, limit: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, known equal up to ``start``, at most ``limit``."""
    n = start
    end = min(len(a), len(b), limit)
    while n < end and a[n] == b[n]:
        n += 1
    return min(n, limit)


class PrefixIndex(Generic[Id]):
    """Entries (by a hashable id) found by their block chains under a cache key. Not
    thread-safe: each tier calls it under its own lock."""

    def __init__(self) -> None:
        self._by_block: dict[tuple[bytes, bytes], dict[Id, None]] = {}

    def add(self, entry_id: Id, key: CacheKey, chain: Sequence[bytes]) -> None:
        for block in chain:
            self._by_block.setdefault((key.layout, block), {})[entry_id] = None

    def remove(self, entry_id: Id, key: CacheKey, chain: Sequence[bytes]) -> None:
        for block in chain:
            holders = self._by_block.get((key.layout, block))
            if holders is not None:
                holders.pop(entry_id, None)
                if not holders:
                    del self._by_block[(key.layout, block)]

    def longest(
        self,
        key: CacheKey,
        tokens: Sequence[int],
        chain: Sequence[bytes],
        limit: int,
        tokens_of: Callable[[Id], Sequence[int]],
        recency: Callable[[Id], int],
    ) -> tuple[Id, int] | None:
        """The entry sharing the longest start with ``tokens`` (at most ``limit``) and that
        length; None when none shares a whole block."""
        holders: dict[Id, None] | None = None
        depth = 0
        for i, block in enumerate(chain):
            found = self._by_block.get((key.layout, block))
            if not found:
                break
            holders, depth = found, i + 1
        if holders is None or limit < BLOCK_TOKENS:
            return None
        known = min(depth * BLOCK_TOKENS, limit)
        best: tuple[Id, int] | None = None
        for entry_id in sorted(holders, key=recency, reverse=True):  # the most recently used first
            shared = shared_tokens(tokens_of(entry_id), tokens, known, limit)
            if best is None or shared > best[1]:
                best = (entry_id, shared)
        return best
