"""Engines and sessions. One database URL in settings; the driver is chosen per use.

The API is asyncio and uses an async engine; the worker, the scheduler and the CLI are
plain threads and use a sync engine. Both speak to the same tables through the same
functions in ``gpuq.store`` (the async side calls them with ``AsyncSession.run_sync``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from gpuq.private_files import prepare_sqlite_file

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _driver_url(url: str, *, asynchronous: bool) -> str:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return str(parsed.set(drivername="sqlite+aiosqlite" if asynchronous else "sqlite"))
    if backend == "postgresql":
        # psycopg 3 speaks both sync and async, so one driver serves every process.
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    raise ValueError(f"unsupported database {backend!r}: use sqlite:/// or postgresql://")


def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the API read while a worker writes; NORMAL sync is durable across
    # process crashes, which is what a job queue needs on one machine.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sync_engine(url: str) -> Engine:
    prepare_sqlite_file(url)
    engine = create_engine(_driver_url(url, asynchronous=False), pool_pre_ping=not is_sqlite(url))
    if is_sqlite(url):
        event.listen(engine, "connect", _tune_sqlite)
    return engine


def async_engine(url: str) -> AsyncEngine:
    prepare_sqlite_file(url)
    engine = create_async_engine(_driver_url(url, asynchronous=True), pool_pre_ping=not is_sqlite(url))
    if is_sqlite(url):
        event.listen(engine.sync_engine, "connect", _tune_sqlite)
    return engine


def sync_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def async_sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
