"""The first admin key. ``gpuq up`` and ``gpuq demo`` create one when the database has
none, print it once, and save it in the data directory (readable by its user only) so
that CLI commands on the same machine find it without being told."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Role
from gpuq.private_files import private_dir
from gpuq.settings import Settings

BOOTSTRAP_OWNER = "admin"


def key_file(data_dir: Path) -> Path:
    return data_dir / "admin.key"


def read_key_file(data_dir: Path) -> str | None:
    path = key_file(data_dir)
    return path.read_text().strip() if path.is_file() else None


def cli_api_key(settings: Settings) -> str | None:
    """The key CLI commands use: GPUQ_API_KEY, else the one the embedded default saved."""
    return settings.api_key or read_key_file(settings.data_dir)


def ensure_admin_key(session: Session, data_dir: Path) -> str | None:
    """Create the first admin key when there is none and save it to ``key_file``.
    Returns the new secret, or None when an active admin key exists already."""
    if store.has_admin_key(session):
        return None
    _key, secret = store.create_api_key(session, name="bootstrap", owner=BOOTSTRAP_OWNER, role=Role.ADMIN)
    path = key_file(data_dir)
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret
