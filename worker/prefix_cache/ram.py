"""The host-RAM tier: saved starts bounded in bytes, least recently used evicted first.

Owned by the engine thread (it saves a stream's start before its cells are lost, and looks up
and restores a start for a new prompt); one lock makes it safe for the threads that read its
figures (the heartbeat, ``/metrics``) and for a lookup from another thread. An entry being
restored is pinned: eviction passes over it, so a start is never dropped, nor its bytes counted
free, while its cells are going into a stream.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from gpuq.prefix_blocks import block_hashes
from worker.prefix_cache.entry import Entry, PrefixIndex, indexable
from worker.prefix_cache.key import CacheKey


class RamTier:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._used_at: dict[int, int] = {}
        self._pins: Counter[int] = Counter()
        self._ids = itertools.count()
        self._clock = itertools.count()
        self._index: PrefixIndex[int] = PrefixIndex()

    @property
    def entries(self) -> int:
        return len(self._entries)

    def put(self, entry: Entry) -> bool:
        """Keeps ``entry`` (False: it was not kept, being too short, larger than the bound, or
        already covered by a kept start). Kept starts that it extends are dropped: it covers them."""
        if not indexable(entry.tokens) or entry.size > self.limit_bytes:
            return False
        with self._lock:
            found = self._longest(entry.key, entry.tokens, entry.chain, len(entry.tokens))
            if found is not None and found[1] == len(entry.tokens):
                self._touch(found[0])  # the same start, or a longer one, is kept already
                return False
            for old_id in self._covered_by(entry):
                self._drop(old_id)
            if not self._make_room(entry.size):
                return False
            entry_id = next(self._ids)
            self._entries[entry_id] = entry
            self._used_at[entry_id] = next(self._clock)
            self._index.add(entry_id, entry.key, entry.chain)
            self.used_bytes += entry.size
            return True

    def longest(self, key: CacheKey, tokens: Sequence[int], *, limit: int) -> tuple[Entry, int] | None:
        """The kept start sharing the most tokens with ``tokens`` (at most ``limit``), marked
        as just used, and how many it shares."""
        with self._lock:
            found = self._longest(key, tokens, block_hashes(tokens, key.namespace), limit)
            if found is None:
                return None
            self._touch(found[0])
            return self._entries[found[0]], found[1]

    @contextmanager
    def pinned(self, entry: Entry) -> Iterator[None]:
        """Eviction passes over ``entry`` inside the block (its cells are being restored)."""
        with self._lock:
            entry_id = self._id_of(entry)
            if entry_id is not None:
                self._pins[entry_id] += 1
        try:
            yield
        finally:
            if entry_id is not None:
                with self._lock:
                    self._pins[entry_id] -= 1
                    if self._pins[entry_id] <= 0:
                        del self._pins[entry_id]

    def chains(self) -> list[tuple[bytes, ...]]:
        """Every kept start's block hashes (the fleet's prefix index, ``worker/prefix_index.py``)."""
        with self._lock:
            return [entry.chain for entry in self._entries.values()]

    def clear(self) -> None:
        with self._lock:
            for entry_id in [i for i in self._entries if i not in self._pins]:
                self._drop(entry_id)

    # ------------------------------------------------------------- under the lock

    def _longest(
        self, key: CacheKey, tokens: Sequence[int], chain: Sequence[bytes], limit: int
    ) -> tuple[int, int] | None:
        return self._index.longest(key, tokens, chain, limit, self._tokens_of, self._used_at.__getitem__)

    def _tokens_of(self, entry_id: int) -> Sequence[int]:
        return self._entries[entry_id].tokens

    def _touch(self, entry_id: int) -> None:
        self._entries.move_to_end(entry_id)
        self._used_at[entry_id] = next(self._clock)

    def _covered_by(self, entry: Entry) -> list[int]:
        """Kept starts of the same key that are prefixes of ``entry``'s tokens."""
        return [
            entry_id
            for entry_id, old in self._entries.items()
            if old.key == entry.key
            and len(old.tokens) <= len(entry.tokens)
            and old.chain[-1] == entry.chain[len(old.chain) - 1]  # kept entries have a block at least
            and entry.tokens[: len(old.tokens)] == old.tokens
            and entry_id not in self._pins
        ]

    def _make_room(self, size: int) -> bool:
        """Evicts the least recently used unpinned entries until ``size`` more bytes fit."""
        for entry_id in list(self._entries):
            if self.used_bytes + size <= self.limit_bytes:
                break
            if entry_id not in self._pins:
                self._drop(entry_id)
                self.evictions += 1
        return self.used_bytes + size <= self.limit_bytes

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        del self._used_at[entry_id]
        self._index.remove(entry_id, entry.key, entry.chain)
        self.used_bytes -= entry.size

    def _id_of(self, entry: Entry) -> int | None:
        return next((i for i, e in self._entries.items() if e is entry), None)
