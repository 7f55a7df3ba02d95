"""The disk tier: saved starts as files in a private directory, for cron and batch runs.

Files outlive a model's unload and the worker's restart: at start the tier reads every file's
header (its cache key and tokens, not its data) into an index, oldest first by modification
time, so tonight's run of yesterday's eval finds its few-shot start. Rules:

- **Private**: the directory is created 0700, each file 0600 from its creation
  (``gpuq/private_files.py``): they hold every tenant's prompts.
- **Atomic**: a file is written under a temporary name, flushed and fsynced, then renamed into
  place (and the directory fsynced), so a worker killed mid-save leaves at most a temporary file,
  which the next start deletes; no half-written file ever carries a served name.
- **Checked**: each file carries its format, its cache key, its tokens, its data's length and a
  BLAKE2b checksum of all of it. A file whose size is not what its header says is deleted at
  start; one whose checksum fails, or whose key is not the one asked for, is deleted when read
  and the start is computed instead: never served. A file of another model or layout is simply
  never found for this one (its key differs) and ages out by the bound.
- **Bounded**: the least recently used files (read or written) go first when the directory holds
  more than its bound.
- **Disk full** (``ENOSPC``, ``EDQUOT``): the tier turns itself off with one warning; the RAM
  tier and the jobs go on.

Writes run on the cache's writer thread, lookups and reads on the engine's; one lock guards
the index. A file deleted between a lookup and its read is a miss.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import struct
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpuq.prefix_blocks import block_hashes
from gpuq.private_files import open_private, private_dir
from worker.prefix_cache.entry import Entry, PrefixIndex, indexable
from worker.prefix_cache.key import CacheKey

log = logging.getLogger(__name__)

MAGIC = b"GPUQKV\x00\x01"  # the file format's name and version
HEADER = struct.Struct("<8s16s16sIQ")  # magic, namespace, layout, tokens, data bytes
CHECKSUM_BYTES = 32
SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DamagedFile(ValueError):
    """A cache file that is truncated, corrupt, of another format or under another key."""


@dataclass(frozen=True, slots=True)
class _File:
    key: CacheKey
    tokens: tuple[int, ...]
    chain: tuple[bytes, ...]
    size: int


def file_name(key: CacheKey, tokens: Sequence[int]) -> str:
    digest = hashlib.blake2b(key.raw + struct.pack(f"<{len(tokens)}i", *tokens), digest_size=16)
    return digest.hexdigest() + SUFFIX


def encode(entry: Entry) -> bytes:
    n = len(entry.tokens)
    head = HEADER.pack(MAGIC, entry.key.namespace, entry.key.layout, n, len(entry.data))
    body = head + struct.pack(f"<{n}i", *entry.tokens) + entry.data
    return body + hashlib.blake2b(body, digest_size=CHECKSUM_BYTES).digest()


def read_header(f: BinaryIO, size: int) -> tuple[CacheKey, tuple[int, ...]]:
    """The key and tokens at the start of an open file of ``size`` bytes (DamagedFile: not a
    whole file of this format)."""
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise DamagedFile("shorter than its header")
    magic, namespace, layout, n_tokens, data_bytes = HEADER.unpack(head)
    if magic != MAGIC:
        raise DamagedFile("not a cache file of this format")
    expected = HEADER.size + 4 * n_tokens + data_bytes + CHECKSUM_BYTES
    if size != expected:
        raise DamagedFile(f"{size} bytes where its header says {expected}")
    raw = f.read(4 * n_tokens)
    return CacheKey(namespace, layout), struct.unpack(f"<{n_tokens}i", raw)


def decode(blob: bytes) -> Entry:
    """The entry a whole file holds (DamagedFile: truncated, corrupt or of another format).
    Through a memoryview: the data (megabytes) is copied once, into the entry."""
    if len(blob) < HEADER.size + CHECKSUM_BYTES:
        raise DamagedFile("shorter than its header")
    view = memoryview(blob)
    body, checksum = view[:-CHECKSUM_BYTES], view[-CHECKSUM_BYTES:]
    if hashlib.blake2b(body, digest_size=CHECKSUM_BYTES).digest() != checksum:
        raise DamagedFile("checksum mismatch")
    magic, namespace, layout, n_tokens, data_bytes = HEADER.unpack_from(body)
    if magic != MAGIC or len(body) != HEADER.size + 4 * n_tokens + data_bytes:
        raise DamagedFile("not a cache file of this format")
    tokens_end = HEADER.size + 4 * n_tokens
    tokens = struct.unpack_from(f"<{n_tokens}i", body, HEADER.size)
    return Entry.make(CacheKey(namespace, layout), tokens, bytes(body[tokens_end:]))


class DiskTier:
    def __init__(self, directory: Path, limit_bytes: int) -> None:
        self.directory = private_dir(directory)
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.enabled = True
        self.evictions = 0
        self.damaged = 0  # files found truncated, corrupt or of another format, and deleted
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}  # least recently used first
        self._used_at: dict[str, int] = {}
        self._clock = itertools.count()
        self._index: PrefixIndex[str] = PrefixIndex()
        self._scan()

    @property
    def entries(self) -> int:
        return len(self._files)

    def put(self, entry: Entry) -> bool:
        """Writes ``entry`` to its file (False: not written: the tier is off, the entry too
        short or too large, or the disk full, which turns the tier off)."""
        if not self.enabled or not indexable(entry.tokens):
            return False
        with self._lock:
            covering = self._index.longest(
                entry.key, entry.tokens, entry.chain, len(entry.tokens), self._tokens_of, self._used_at.__getitem__
            )
            if covering is not None and covering[1] == len(entry.tokens):
                self._touch(covering[0])  # this start, or a longer one, is on disk already
                return True
        blob = encode(entry)
        if len(blob) > self.limit_bytes:
            return False
        try:
            name = file_name(entry.key, entry.tokens)
            self._write(name, blob)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                self.enabled = False
                log.warning(
                    "prefix cache: %s is full (%s); the disk tier is off until the worker restarts", self.directory, exc
                )
            else:
                log.warning("prefix cache: could not write %s: %s", self.directory / name, exc)
            return False
        with self._lock:
            self._add(name, _File(entry.key, entry.tokens, entry.chain, len(blob)))
            self._prune()
        return True

    def longest(self, key: CacheKey, tokens: Sequence[int], *, limit: int) -> tuple[str, int] | None:
        """The file sharing the longest start with ``tokens`` (at most ``limit``): its name and length."""
        with self._lock:
            return self._index.longest(
                key, tokens, block_hashes(tokens, key.namespace), limit, self._tokens_of, self._used_at.__getitem__
            )

    def load(self, name: str, key: CacheKey) -> Entry | None:
        """The entry in file ``name`` if it is whole and under ``key``; else the file is deleted
        (counted in ``damaged``) and None returned, as when it is gone."""
        path = self.directory / name
        try:
            blob = path.read_bytes()
            entry = decode(blob)
            if entry.key != key:
                raise DamagedFile("under another cache key than its index entry")
        except FileNotFoundError:
            with self._lock:
                self._forget(name)
            return None
        except (OSError, DamagedFile) as exc:
            log.warning("prefix cache: %s is damaged (%s); deleted, its start will be computed", path, exc)
            with self._lock:
                self.damaged += 1
                self._forget(name)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            if name in self._files:
                self._touch(name)
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU order survives a restart
        return entry

    # ------------------------------------------------------------- files

    def _write(self, name: str, blob: bytes) -> None:
        temp = self.directory / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open_private(temp, exclusive=True) as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.directory / name)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_directory(self.directory)

    def _scan(self) -> None:
        """The index from the directory: temporary files (a save cut short) deleted, damaged
        files deleted, the others indexed oldest first; then pruned to the bound."""
        found: list[tuple[int, str, _File]] = []
        for path in self.directory.iterdir():
            if path.name.startswith(TEMP_PREFIX):
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(SUFFIX) or not path.is_file():
                continue
            try:
                stat = path.stat()
                with path.open("rb") as f:
                    key, tokens = read_header(f, stat.st_size)
            except (OSError, DamagedFile, struct.error) as exc:
                log.warning("prefix cache: %s is damaged (%s); deleted", path, exc)
                self.damaged += 1
                path.unlink(missing_ok=True)
                continue
            if not indexable(tokens):
                path.unlink(missing_ok=True)
                continue
            chain = tuple(block_hashes(tokens, key.namespace))
            found.append((stat.st_mtime_ns, path.name, _File(key, tokens, chain, stat.st_size)))
        for _mtime, name, record in sorted(found, key=lambda item: (item[0], item[1])):
            self._add(name, record)
        self._prune()

    # ------------------------------------------------------------- under the lock

    def _add(self, name: str, record: _File) -> None:
        self._files[name] = record
        self._used_at[name] = next(self._clock)
        self._index.add(name, record.key, record.chain)
        self.used_bytes += record.size

    def _touch(self, name: str) -> None:
        self._files[name] = self._files.pop(name)
        self._used_at[name] = next(self._clock)

    def _forget(self, name: str) -> None:
        record = self._files.pop(name, None)
        if record is not None:
            del self._used_at[name]
            self._index.remove(name, record.key, record.chain)
            self.used_bytes -= record.size

    def _prune(self) -> None:
        while self.used_bytes > self.limit_bytes and self._files:
            name = next(iter(self._files))
            self._forget(name)
            (self.directory / name).unlink(missing_ok=True)
            self.evictions += 1

    def _tokens_of(self, name: str) -> Sequence[int]:
        return self._files[name].tokens


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
