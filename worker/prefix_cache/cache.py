"""The prefix cache's two tiers behind one object: host RAM, then an optional directory.

A stream's start is saved when its cells would be lost (its stream reclaimed): into the RAM
tier, and written through to the disk tier by a writer thread of its own (the engine never waits
on a disk). A new prompt's start is looked up in both: the longer match wins, RAM on a tie; a
start read from disk goes into RAM too. The caller (the engine thread) restores the found
bytes into a free stream (``worker/decoding/kv_state.py``) inside :meth:`PrefixCache.restoring`,
which pins the entry, and reports with :meth:`restored` whether llama.cpp took them.

Threads: the engine thread owns lookups, saves and restores; the writer thread writes files;
:meth:`stats` may be read from any thread (the heartbeat, ``/metrics``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuq.fleet.prefix_cache_stats import PrefixCacheStats, Tier
from worker.prefix_cache.disk import DiskTier
from worker.prefix_cache.entry import Entry, indexable
from worker.prefix_cache.key import CacheKey
from worker.prefix_cache.ram import RamTier

log = logging.getLogger(__name__)

GIB = 1 << 30
# GPUQ_WORKER_PREFIX_CACHE_RAM_BYTES=-1: a quarter of the host's available memory at the worker's
# start, shared among the host's workers, at most 8 GiB each (llama-server's --cache-ram default).
AUTO_RAM_FRACTION = 0.25
AUTO_RAM_CAP_BYTES = 8 * GIB
AUTO_RAM_UNKNOWN_BYTES = 1 * GIB  # no /proc/meminfo (not Linux)
WRITE_QUEUE = 8  # saves waiting for the disk; more are dropped (the RAM tier has them)


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The kernel's estimate of memory available for new work (MemAvailable), if it gives one."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def ram_limit_bytes(setting: int, *, available: int | None, workers: int = 1) -> int:
    """The RAM tier's bound: ``setting`` (bytes; 0 turns the tier off), or with -1 a quarter of
    ``available`` shared among the host's ``workers``, capped at 8 GiB."""
    if setting >= 0:
        return setting
    if available is None:
        return AUTO_RAM_UNKNOWN_BYTES
    return min(AUTO_RAM_CAP_BYTES, int(available * AUTO_RAM_FRACTION) // max(1, workers))


@dataclass(frozen=True, slots=True)
class Found:
    entry: Entry
    tokens: int  # prompt tokens its cells cover: restore, then keep ``tokens`` positions
    tier: Tier


class PrefixCache:
    def __init__(self, *, ram_limit_bytes: int, disk: DiskTier | None = None) -> None:
        self.ram = RamTier(ram_limit_bytes)
        self.disk = disk
        self._lock = threading.Lock()  # the counters below
        self._hits = {"ram": 0, "disk": 0}
        self._restored = {"ram": 0, "disk": 0}
        self._misses = 0
        self._failures = 0
        self._saves = 0
        self._dropped = 0
        self._writes: queue.Queue[Entry | None] = queue.Queue(WRITE_QUEUE)
        self._writer: threading.Thread | None = None

    @classmethod
    def open(cls, *, ram_limit_bytes: int, disk_dir: Path | None = None, disk_limit_bytes: int = 0) -> PrefixCache:
        """The cache as the settings describe it; a directory that cannot be made leaves the disk tier off."""
        disk = None
        if disk_dir is not None and disk_limit_bytes > 0:
            try:
                disk = DiskTier(disk_dir, disk_limit_bytes)
            except OSError as exc:
                log.warning("prefix cache: %s cannot be used (%s); the disk tier is off", disk_dir, exc)
        return cls(ram_limit_bytes=ram_limit_bytes, disk=disk)

    @property
    def enabled(self) -> bool:
        return self.ram.limit_bytes > 0 or (self.disk is not None and self.disk.enabled)

    def lookup(
        self, key: CacheKey, tokens: Sequence[int], *, limit: int, unit: int = 1, at_least: int = 1
    ) -> Found | None:
        """The saved start sharing the most of ``tokens``, from RAM or disk, as many of its
        tokens as the engine may reuse of this prompt: at most ``limit``, a multiple of ``unit``
        (the prefill chunk where only whole chunks are reused). None, counted as a miss, when
        none shares ``at_least`` tokens (what the decoder's streams already offer, and more)."""
        limit = limit // unit * unit
        floor = max(unit, at_least)
        in_ram = self.ram.longest(key, tokens, limit=limit)
        on_disk = self.disk.longest(key, tokens, limit=limit) if self.disk is not None else None
        in_ram = None if in_ram is None or in_ram[1] // unit * unit < floor else (in_ram[0], in_ram[1] // unit * unit)
        on_disk = (
            None if on_disk is None or on_disk[1] // unit * unit < floor else (on_disk[0], on_disk[1] // unit * unit)
        )
        found: Found | None = None
        if on_disk is not None and (in_ram is None or on_disk[1] > in_ram[1]):
            entry = self.disk.load(on_disk[0], key) if self.disk is not None else None
            if entry is not None:
                self.ram.put(entry)  # read again from RAM next time
                found = Found(entry, on_disk[1], "disk")
        if found is None and in_ram is not None:
            found = Found(in_ram[0], in_ram[1], "ram")
        with self._lock:
            if found is None:
                self._misses += 1
            else:
                self._hits[found.tier] += 1
        return found

    def covers(self, key: CacheKey, tokens: Sequence[int]) -> bool:
        """The RAM tier keeps this start already, or a longer one that begins with it."""
        found = self.ram.longest(key, tokens, limit=len(tokens))
        return found is not None and found[1] == len(tokens)

    @contextmanager
    def restoring(self, found: Found) -> Iterator[None]:
        """Around the restore of ``found``: the RAM tier keeps it meanwhile."""
        with self.ram.pinned(found.entry):
            yield

    def restored(self, found: Found, *, ok: bool) -> None:
        """The caller's restore of ``found``: ``ok``, its tokens came from the cache; else llama.cpp refused them."""
        with self._lock:
            if ok:
                self._restored[found.tier] += found.tokens
            else:
                self._failures += 1

    def save(self, key: CacheKey, tokens: Sequence[int], data: bytes) -> None:
        """Keeps the start ``tokens`` (whose cells ``data`` holds): into RAM now, to disk soon."""
        if not indexable(tokens):
            return
        entry = Entry.make(key, tokens, data)
        kept = self.ram.put(entry)
        with self._lock:
            self._saves += int(kept)
        if self.disk is not None and self.disk.enabled:
            self._start_writer()
            try:
                self._writes.put_nowait(entry)
            except queue.Full:
                with self._lock:
                    self._dropped += 1

    def flush(self) -> None:
        """Waits until every queued save is on disk (or given up)."""
        self._writes.join()

    def close(self) -> None:
        """Writes what is queued, then stops the writer thread (the disk files stay)."""
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join()
            self._writer = None

    def stats(self) -> PrefixCacheStats:
        disk = self.disk
        with self._lock:
            return PrefixCacheStats(
                ram_bytes=self.ram.used_bytes,
                ram_limit_bytes=self.ram.limit_bytes,
                ram_entries=self.ram.entries,
                ram_evictions=self.ram.evictions,
                disk_enabled=disk is not None and disk.enabled,
                disk_bytes=disk.used_bytes if disk else 0,
                disk_limit_bytes=disk.limit_bytes if disk else 0,
                disk_entries=disk.entries if disk else 0,
                disk_evictions=disk.evictions if disk else 0,
                disk_damaged=disk.damaged if disk else 0,
                disk_writes_dropped=self._dropped,
                hits_ram=self._hits["ram"],
                hits_disk=self._hits["disk"],
                misses=self._misses,
                tokens_restored_ram=self._restored["ram"],
                tokens_restored_disk=self._restored["disk"],
                restore_failures=self._failures,
                saves=self._saves,
            )

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="prefix-cache-writer", daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        assert self.disk is not None
        while True:
            entry = self._writes.get()
            try:
                if entry is None:
                    return
                self.disk.put(entry)
            except Exception:  # a bug here must not kill the worker: the RAM tier goes on
                log.exception("prefix cache: writing a start to disk failed")
            finally:
                self._writes.task_done()
