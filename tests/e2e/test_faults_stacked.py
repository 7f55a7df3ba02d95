"""Faults that stack, caused for real on a private Redis and a private PostgreSQL: a worker
starting (or restarting after a kill) while Redis or the database is down waits for it
instead of counting as a crash, and its supervisor survives a database outage."""

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.local.redis_server import PrivateRedis
from gpuq.testing import GpuqProcesses
from tests.conftest import migrate_and_register
from tests.e2e.conftest import wait_until
from tests.private_postgres import PrivatePostgres

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
ONE_GPU = {"GPUQ_SIMULATED_GPUS": "24", "GPUQ_WORKER_THREADS": "1"}


def _children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _kill_workers(supervisor_pid: int) -> None:
    """SIGKILL the supervisor's workers (a crash each) and wait until it has started new ones."""
    killed = _children(supervisor_pid)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _children(supervisor_pid) - killed, "the supervisor never restarted its worker", 30)


def _gpus(database_url: str) -> list[tuple[bool, str | None]]:
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            return [(g.healthy, g.unhealthy_reason) for g in store.list_gpus(session)]
    finally:
        engine.dispose()


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis", persist=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres().init()
    try:
        server.start()
        migrate_and_register(server.url)
        yield server
    finally:
        server.remove()


def test_workers_starting_during_a_redis_outage_wait_for_it_and_never_mark_the_gpu(
    tmp_path, database_url, private_redis
):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, private_redis.url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_TTL_S": "30", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1"} | ONE_GPU
    try:
        # A host booting during a Redis failover: the supervisor starts while Redis is down for 20 s.
        private_redis.stop()
        supervisor = processes.spawn_supervisor()
        time.sleep(20)
        supervisor_alive_at_boot = supervisor.popen.poll() is None
        private_redis.start(port=private_redis.port)
        _api, url = processes.start_api()
        with processes.client(url) as client:
            first = [client.submit(NOOP)["id"] for _ in range(3)]
            firsts = [client.wait(job_id, timeout_s=120)["status"] for job_id in first]

            # A worker killed during a 25 s outage (TTL 30 s) restarts into it.
            private_redis.stop()
            _kill_workers(supervisor.popen.pid)
            time.sleep(25)
            supervisor_alive_in_outage = supervisor.popen.poll() is None
            private_redis.start(port=private_redis.port)
            second = [client.submit(NOOP)["id"] for _ in range(6)]
            seconds = [client.wait(job_id, timeout_s=150)["status"] for job_id in second]
    finally:
        processes.stop_all()
    assert supervisor_alive_at_boot and supervisor_alive_in_outage
    assert firsts == ["succeeded"] * 3 and seconds == ["succeeded"] * 6
    assert _gpus(database_url) == [(True, None)], "a Redis outage says nothing about the GPU"


def test_a_database_outage_neither_marks_the_gpu_nor_kills_the_supervisor(tmp_path, postgres, private_redis):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(postgres.url, private_redis.url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_TTL_S": "30", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1"} | ONE_GPU
    try:
        supervisor, _workers = processes.start_supervisor(expected_workers=1)
        _api, url = processes.start_api()
        with processes.client(url) as client:
            # The worker killed (one abnormal exit) restarts into a 15 s outage: it waits for the
            # database instead of crashing on it.
            postgres.stop()
            _kill_workers(supervisor.popen.pid)
            time.sleep(15)
            alive_after_restart = supervisor.popen.poll() is None
            postgres.start()
            jobs = [client.wait(client.submit(NOOP)["id"], timeout_s=120)["status"] for _ in range(3)]
            healthy_after_outage = _gpus(postgres.url)

            # Two more real crashes, in a second outage: three within the window, so the
            # supervisor marks the GPU, cannot write the mark yet, and keeps running.
            postgres.stop()
            _kill_workers(supervisor.popen.pid)
            _kill_workers(supervisor.popen.pid)
            time.sleep(2)
            alive_after_marking = supervisor.popen.poll() is None
            postgres.start()
            wait_until(lambda: not _gpus(postgres.url)[0][0], "the kept mark was never written", 30)
            marked = _gpus(postgres.url)
    finally:
        processes.stop_all()
    assert alive_after_restart and alive_after_marking
    assert jobs == ["succeeded"] * 3 and healthy_after_outage == [(True, None)]
    [(_healthy, reason)] = marked
    assert "exited abnormally 3 times" in reason and "killed by SIGKILL" in reason
    assert "CUDA" not in reason  # the true cause: a kill, not a CUDA abort
