import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.jobs import outcome_spool
from gpuq.jobs.reconciler import ReconcileReport, reconcile_once
from gpuq.testing import GpuqProcesses
from tests.conftest import DATABASES, RedisDbs, Template, database_template, redis_db

# No pytestmark here: a conftest's marks reach no test. tests/conftest.py marks everything
# under tests/e2e as e2e (and the PostgreSQL runs as postgres).


@dataclass
class RunningSystem:
    processes: GpuqProcesses
    client: GpuqClient
    url: str
    worker_name: str


def _running_system(template: Template, workdir: Path, redis_server_url: str, db_index: int) -> Iterator[RunningSystem]:
    (workdir / "models").mkdir(parents=True, exist_ok=True)
    with template.copy(workdir) as database_url, redis_db(redis_server_url, db_index) as redis_url:
        processes = GpuqProcesses(database_url, redis_url, workdir)
        try:
            _api, url = processes.start_api()
            _worker, worker_name = processes.start_worker()
            with processes.client(url) as client:
                yield RunningSystem(processes, client, url, worker_name)
        finally:
            processes.stop_all()


def system_on(database: str) -> pytest.MarkDecorator:
    """A module's ``system`` on one database only: for the modules that test what a client sees
    (the drop-in routes' shapes, streams, sampling), whose SQL (job rows, claims, outcomes) the
    API, worker and store tests and the e2e modules left on both databases already run on each;
    a second system would run the same generations again for the same answers."""
    return pytest.mark.parametrize("system", [database], indirect=True, scope="module")


@pytest.fixture(scope="module", params=DATABASES)
def system(request, tmp_path_factory, redis_server_url, redis_dbs: RedisDbs) -> Iterator[RunningSystem]:
    """The API and one worker as real processes, shared by a module's tests, on each database."""
    workdir = tmp_path_factory.mktemp(f"system-{request.param}")
    template = database_template(request, request.param)
    yield from _running_system(template, workdir, redis_server_url, redis_dbs.spare)


@pytest.fixture
def processes(tmp_path, database_url, redis_url) -> Iterator[GpuqProcesses]:
    """For tests that start, stop and kill processes themselves (SQLite unless parametrized)."""
    (tmp_path / "models").mkdir()
    procs = GpuqProcesses(database_url, redis_url, tmp_path)
    yield procs
    procs.stop_all()


def as_a_foreground_job() -> None:
    """``preexec_fn`` for a command a test sends Ctrl-C (SIGINT): as a terminal's foreground job
    it gets the signal's default, whatever the suite was started under. A shell without job
    control starts its background commands with SIGINT ignored, children inherit that, and
    Python then never raises KeyboardInterrupt: Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Polls condition until it holds; raises TimeoutError saying what never happened."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def blocked_in_blpop(redis: Redis) -> int:
    """How many clients of this Redis database wait in BLPOP now (idle workers do)."""
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    return sum(
        1 for c in redis.client_list() if c.get("cmd") == "blpop" and "b" in c.get("flags", "") and int(c["db"]) == db
    )


def reconcile(
    processes: GpuqProcesses,
    *,
    in_flight_limit_s: float = 0.0,
    orphan_limit_s: float = 60.0,
    redis_settle_s: float = 0.0,
) -> ReconcileReport:
    """One pass of the reconciler over a running system, as `gpuq scheduler` would make
    (re-enqueueing at once, by default, a job popped but not started, and judging workers
    however young the test's Redis is)."""
    engine = sync_engine(processes.database_url)
    redis = Redis.from_url(processes.redis_url)
    try:
        with sync_sessions(engine)() as session:
            return reconcile_once(
                session,
                redis,
                grace_s=0,
                max_attempts=3,
                timeout_s=600,
                in_flight_limit_s=in_flight_limit_s,
                orphan_limit_s=orphan_limit_s,
                redis_settle_s=redis_settle_s,
                spool_dir=outcome_spool.spool_dir(processes.workdir),  # the processes' data directory
            )
    finally:
        redis.close()
        engine.dispose()


def until(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Polls ``check`` until it returns something true, and returns that; raises after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")


def environ(pid: int) -> dict[str, str]:
    """A running process's environment, as the kernel has it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)
