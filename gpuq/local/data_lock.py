"""One ``gpuq up`` per data directory.

Two systems on one data directory would each start a Redis on the same append-only file
and diverge: two copies of the queues, jobs run twice. So ``gpuq up`` (and ``gpuq demo``)
hold an exclusive ``flock`` on ``<data_dir>/gpuq.lock`` while they run. The kernel drops it
when the last process holding the file closes it, whatever way it ends, so a crash leaves
no stale lock. The private Redis and the supervisor inherit the descriptor: the lock is
held until they have exited too, which is what a second start must wait for.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuq.private_files import private_dir

LOCK_FILE = "gpuq.lock"


class DataDirInUse(Exception):
    """Another gpuq is running on this data directory."""


@contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[int]:
    """Holds the data directory's lock; yields its descriptor, for children to inherit. A new
    data directory is created 0700 here, the first thing ``gpuq up`` writes."""
    private_dir(data_dir)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise DataDirInUse(
                f"another gpuq (pid {holder}) is running on the data directory {data_dir.resolve()}: "
                "stop it first, or give this one its own GPUQ_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)
