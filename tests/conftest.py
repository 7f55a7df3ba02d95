"""Fixtures on real parts: the running PostgreSQL and Redis (or a private redis-server when
none is reachable), SQLite files, and the bundled GGUF model.

Isolation: each test gets a fresh database (a new PostgreSQL database, or a new SQLite
file) migrated with Alembic, and a Redis db index that is flushed before and after it.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from redis import Redis
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Role
from gpuq.local.redis_server import PrivateRedis
from gpuq.registry.bundled import require_bundled_model_path
from gpuq.registry.models import register_bundled_model

POSTGRES_URL = os.environ.get("GPUQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GPUQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_DB = int(os.environ.get("GPUQ_TEST_REDIS_DB", "13"))
DATABASES = ["sqlite", "postgresql"]


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _reachable(POSTGRES_URL, 5432):
        pytest.exit(
            f"PostgreSQL is not reachable at {POSTGRES_URL}: the suite runs its SQL tests on PostgreSQL "
            "as well as SQLite. Start PostgreSQL (trust auth) or set GPUQ_TEST_POSTGRES_URL.",
            returncode=2,
        )
    try:
        require_bundled_model_path()
    except FileNotFoundError as exc:
        pytest.exit(str(exc), returncode=2)


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """The machine's Redis, or a private one started for this run when none is reachable."""
    if _reachable(REDIS_URL, 6379):
        yield REDIS_URL.rstrip("/")
        return
    private = PrivateRedis(Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuq-test-redis-{os.getpid()}", persist=False)
    yield private.start().rsplit("/", 1)[0]
    private.stop()


@contextmanager
def redis_db(server_url: str, index: int) -> Iterator[str]:
    """A Redis database index, empty before and after."""
    url = f"{server_url}/{index}"
    client = Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def redis_url(redis_server_url: str) -> Iterator[str]:
    with redis_db(redis_server_url, REDIS_DB) as url:
        yield url


@pytest.fixture
def redis(redis_url: str) -> Iterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    client.close()


def _create_postgres_database() -> tuple[str, str]:
    name = f"gpuq_test_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"


def _drop_postgres_database(name: str) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database(backend: str, directory: Path) -> Iterator[str]:
    """An empty database: a new SQLite file, or a new PostgreSQL database dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'gpuq.db'}"
        return
    name, url = _create_postgres_database()
    try:
        yield url
    finally:
        _drop_postgres_database(name)


def migrate_and_register(url: str) -> str:
    """Migrated, with the bundled model registered, as `gpuq db upgrade` leaves it."""
    migrate.upgrade(url)
    engine = sync_engine(url)
    with sync_sessions(engine)() as session:
        register_bundled_model(session)
    engine.dispose()
    return url


@pytest.fixture
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables yet, on the backend named by the test's parameter."""
    with fresh_database(getattr(request, "param", "sqlite"), tmp_path) as url:
        yield url


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    return migrate_and_register(empty_database_url)


@pytest.fixture
def session(database_url: str) -> Iterator[Session]:
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:
        yield s
    engine.dispose()


def both_databases(func):  # type: ignore[no-untyped-def]
    """Run a test once on SQLite and once on PostgreSQL."""
    return pytest.mark.parametrize("empty_database_url", DATABASES, indirect=True)(func)


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(require_bundled_model_path())


@pytest.fixture
def make_key(database_url: str) -> Iterator:  # type: ignore[type-arg]
    """Creates API keys in the test's database: ``make_key("submitter", "acme", max_queued_jobs=2)``."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)

    def make(role: str = "submitter", owner: str = "acme", **limits: int) -> str:
        with sessions() as s:
            _key, secret = store.create_api_key(s, name=f"test-{role}-{owner}", owner=owner, role=Role(role), **limits)
        return secret

    yield make
    engine.dispose()


@pytest.fixture
def admin_key(make_key) -> str:  # type: ignore[no-untyped-def]
    return make_key("admin", "admin")  # type: ignore[no-any-return]
