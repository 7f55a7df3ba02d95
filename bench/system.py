"""What the benchmarks start from: an empty Redis db and a freshly migrated database."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redis import Redis

from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.registry.models import register_bundled_model


@contextmanager
def fresh_system_state(redis_url: str, database_url: str | None) -> Iterator[tuple[str, str, Path]]:
    """An empty Redis db and a freshly migrated database (SQLite in a temp dir by default)."""
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "models").mkdir()
        url = database_url or f"sqlite:///{workdir / 'gpuq.db'}"
        migrate.upgrade(url)
        engine = sync_engine(url)
        with sync_sessions(engine)() as session:
            register_bundled_model(session)
        engine.dispose()
        redis = Redis.from_url(redis_url)
        redis.flushdb()
        try:
            yield redis_url, url, workdir
        finally:
            redis.flushdb()
            redis.close()
