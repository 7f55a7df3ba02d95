"""Faults that stack, caused for real on a private Redis and a private PostgreSQL: a worker
starting (or restarting after a kill) while Redis or the database is down waits for it
instead of counting as a crash, and its supervisor survives a database outage; outcomes
finished while both are down outlive their worker's death in a file."""

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.jobs import outcome_spool
from gpuq.local.redis_server import PrivateRedis
from gpuq.testing import GpuqProcesses
from tests.conftest import migrate_and_register
from tests.e2e.conftest import reconcile, wait_until
from tests.private_postgres import PrivatePostgres

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
# At temperature 0 SmolLM2 keeps counting to max_tokens: a job that outlasts the outage's start.
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}
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


@pytest.mark.parametrize("writer", ["reconciler", "restarted worker"])
def test_outcomes_finished_while_redis_and_the_database_are_both_down_outlive_their_workers_death(
    tmp_path, private_redis, postgres, writer
):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(postgres.url, private_redis.url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_TTL_S": "10", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1"}
    spools = outcome_spool.spool_dir(tmp_path)  # the processes' data directory
    try:
        _api, url = processes.start_api()
        worker, worker_name = processes.start_worker()
        with processes.client(url) as client:
            job_id = client.submit(LONG | {"max_tokens": 250})["id"]
            wait_until(lambda: client.job(job_id)["status"] == "running", "the generation never started")
        private_redis.stop()
        postgres.stop()
        # The generation ends meanwhile: neither the database nor Redis can take its outcome.
        wait_until(lambda: list(spools.glob("*.jsonl")), "the outcome was never spooled to a file", 120)
        [spooled] = list(spools.glob("*.jsonl"))
        modes = (spools.stat().st_mode & 0o777, spooled.stat().st_mode & 0o777)
        worker.kill()  # SIGKILL while its outcome is unwritten: only the file has it
        private_redis.start(port=private_redis.port)
        postgres.start()
        time.sleep(11)  # the dead worker's key expires (TTL 10 s)
        if writer == "reconciler":
            report = reconcile(processes)
            assert report.spooled == [job_id] and report.recovered == []  # written, not run again
        else:
            processes.start_worker()  # it writes the dead worker's spooled outcomes as it starts
        wait_until(lambda: _job(postgres.url, job_id)[0] == "succeeded", "the spooled outcome was never written")
        report = reconcile(processes)
    finally:
        processes.stop_all()
    assert report.recovered == []  # nothing left to run again
    status, attempts, tokens, ran_on, runs = _job(postgres.url, job_id)
    assert (status, attempts, tokens, ran_on) == ("succeeded", 1, 250, worker_name)
    assert runs == [(worker_name, "succeeded")]
    assert modes == (0o700, 0o600)  # it holds a tenant's result
    assert list(spools.glob("*")) == []


def _job(database_url: str, job_id: str) -> tuple[str, int, int | None, str | None, list[tuple[str, str | None]]]:
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            job = store.get_job(session, job_id)
            assert job is not None
            runs = [(run.worker, run.outcome) for run in store.runs_of_job(session, job_id)]
            return job.status, job.attempts, job.completion_tokens, job.worker, runs
    finally:
        engine.dispose()


def test_a_bounded_soak_with_redis_and_the_database_restarted_under_load_runs_every_job_once(
    tmp_path, private_redis, postgres
):
    """Jobs submitted without pause while the test's Redis, then its PostgreSQL, stop for 5 s
    and start again: submissions refused during an outage get a 503 (and are sent again by
    the client), and every job accepted ends succeeded, run once."""
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(postgres.url, private_redis.url, tmp_path)
    processes.settings |= {
        "GPUQ_WORKER_TTL_S": "30",
        "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1",
        "GPUQ_RECONCILE_INTERVAL_S": "2",
    }
    accepted: list[str] = []
    refused: list[int] = []
    stop = threading.Event()
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        processes.start_scheduler()
        headers = {"authorization": f"Bearer {processes.admin_key}"}

        def submit_without_pause() -> None:
            with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
                while not stop.is_set():
                    try:
                        answer = http.post("/v1/jobs", json=NOOP)
                    except httpx.TransportError:
                        continue
                    if answer.status_code == 202:
                        accepted.append(answer.json()["id"])
                    else:
                        refused.append(answer.status_code)
                        stop.wait(0.2)

        submitter = threading.Thread(target=submit_without_pause)
        submitter.start()
        try:
            wait_until(lambda: len(accepted) >= 50, "no job was accepted")
            for outage in (private_redis, postgres):
                outage.stop()
                time.sleep(5)
                if outage is private_redis:
                    private_redis.start(port=private_redis.port)
                else:
                    postgres.start()
                wait_until(lambda n=len(accepted): len(accepted) > n + 50, "submissions never resumed", 60)
        finally:
            stop.set()
            submitter.join(timeout=60)
        with contextlib.suppress(TimeoutError):  # the assertion below names the jobs that did not end
            wait_until(lambda: _all_final(postgres.url, accepted), "some accepted jobs never finished", 180)
        ends = _ends(postgres.url, accepted)
    finally:
        processes.stop_all()
    assert len(accepted) > 150 and refused and set(refused) == {503}  # an outage is a 503, never a 500
    assert {end for end in ends.values()} == {("succeeded", 1, 1)}, {
        i: e for i, e in ends.items() if e != ("succeeded", 1, 1)
    }


def _ends(database_url: str, job_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """Each job's status, attempts and number of runs, as SQL has them."""
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            return {
                i: (job.status, job.attempts, len(store.runs_of_job(session, i)))
                for i in job_ids
                if (job := store.get_job(session, i)) is not None
            } | {i: ("missing", 0, 0) for i in job_ids if store.get_job(session, i) is None}
    finally:
        engine.dispose()


def _all_final(database_url: str, job_ids: list[str]) -> bool:
    return all(status not in ("queued", "running") for status, _a, _r in _ends(database_url, job_ids).values())
