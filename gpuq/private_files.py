"""Files at rest that only gpuq's own user may read: the data directory (0700), and the
SQLite database, batch files, keys and secrets in it (0600).

They hold every tenant's prompts and results, and the webhook secret, so the process
umask (often 022: readable by every local user) is not trusted. Files are created with
their mode (``os.open``), never created first and narrowed after. The SQLite database is
created empty with 0600 before SQLite opens it, because SQLite gives its ``-wal`` and
``-shm`` files the database file's mode.

An existing data directory is not changed (it may be a directory the operator chose for
other reasons); the API and the scheduler warn at start about one that others may read.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def private_dir(path: Path) -> Path:
    """``path`` as a directory, created 0700 (its missing parents too) if it is not there."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is narrowed by the umask, never widened: make it exact
    return path


def open_private(path: Path, *, exclusive: bool = False) -> BinaryIO:
    """``path`` opened for writing (truncated, or new only with ``exclusive``), mode 0600 from its creation."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # an existing file keeps its mode through O_CREAT: narrow it
    return os.fdopen(fd, "wb")


def write_private(path: Path, data: bytes) -> None:
    with open_private(path) as f:
        f.write(data)


def open_to_others(path: Path) -> bool:
    """Whether other local users may read or enter ``path``."""
    return path.exists() and bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def warn_if_open_to_others(data_dir: Path) -> None:
    """Say so at start when other local users may read the data directory (gpuq never
    narrows a directory it did not create)."""
    if open_to_others(data_dir):
        log.warning("the data directory %s is open to other local users; `chmod 700` it (docs/security.md)", data_dir)


def prepare_sqlite_file(database_url: str) -> None:
    """For a SQLite URL: its directory (0700 if gpuq creates it), and the database file and
    SQLite's companions narrowed to 0600, the database created empty so if it is new."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    database = Path(url.database)
    private_dir(database.parent)
    if not database.exists():
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    for suffix in SQLITE_SUFFIXES:
        companion = Path(f"{database}{suffix}")
        if companion.exists() and open_to_others(companion):
            os.chmod(companion, FILE_MODE)
