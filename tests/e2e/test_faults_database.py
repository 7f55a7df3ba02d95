"""Faults of the database under a running system: an outage (a PostgreSQL of the test's
own, stopped and started again), and a claim whose acknowledgement is lost on the wire."""

import time
from collections.abc import Iterator
from typing import cast
from urllib.parse import urlsplit

import httpx
import pytest
from redis import Redis

from gpuq.testing import GpuqProcesses
from tests.conftest import migrate_and_register
from tests.e2e.conftest import blocked_in_blpop, reconcile, wait_until
from tests.private_postgres import PrivatePostgres
from tests.tcp_proxy import TcpProxy

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
# At temperature 0 SmolLM2 keeps counting to max_tokens: a job that outlasts the outage's start.
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}


@pytest.fixture
def database() -> Iterator[PrivatePostgres]:
    postgres = PrivatePostgres().init()
    try:
        postgres.start()
        migrate_and_register(postgres.url)
        yield postgres
    finally:
        postgres.remove()


@pytest.fixture
def outage_system(tmp_path, database, redis_url) -> Iterator[GpuqProcesses]:
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database.url, redis_url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_TTL_S": "10", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1"}
    yield processes
    processes.stop_all()


def _spooled(redis: Redis, worker: str) -> set[bytes]:
    return set(cast(list[bytes], redis.hkeys(f"gpuq:outcome-spool:{worker}")))


def test_a_database_outage_loses_nothing_and_runs_nothing_twice(outage_system, database):
    processes = outage_system
    _api, url = processes.start_api()
    worker, worker_name = processes.start_worker()
    redis = Redis.from_url(processes.redis_url)
    with (
        processes.client(url) as client,
        httpx.Client(base_url=url, headers={"authorization": f"Bearer {processes.admin_key}"}) as http,
    ):
        running = client.submit(LONG | {"max_tokens": 150})
        waiting = [client.submit(NOOP)["id"] for _ in range(3)]  # the worker takes them after the generation
        wait_until(lambda: client.job(running["id"])["status"] == "running", "the generation never started")

        database.stop()
        outage_started = time.monotonic()
        during = [http.get(f"/v1/jobs/{running['id']}"), http.post("/v1/jobs", json=NOOP), http.get("/readyz")]
        # The generation ends during the outage: its outcome waits in the worker, copied to Redis.
        wait_until(lambda: running["id"].encode() in _spooled(redis, worker_name), "the outcome was never spooled")
        time.sleep(max(0.0, 13 - (time.monotonic() - outage_started)))  # a 13 s outage, as reported
        still_alive = worker.popen.poll() is None
        queue_during = redis.llen(f"rq:queue:gpuq:{MODEL}:noop:normal:admin")
        database.start()

        done = client.wait(running["id"], timeout_s=120)
        others = [client.wait(job_id, timeout_s=120) for job_id in waiting]
        after = client.wait(client.submit(NOOP)["id"], timeout_s=60)
    failed_registry = redis.zcard(f"rq:failed:gpuq:{MODEL}:noop:normal:admin")
    spool_left = _spooled(redis, worker_name)
    redis.close()

    read, submit, ready = during  # JSON 503s the client may retry, on a connection that stays usable
    for response in during:
        assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
    assert read.json()["detail"] == submit.json()["detail"] == "the database is unavailable; retry shortly"
    assert ready.json()["status"] == "unavailable" and ready.json()["database"].startswith("unreachable")
    assert still_alive, "the worker must ride out the outage, not crash"
    assert queue_during >= 2, "jobs the worker could not claim stay in their queue, not in RQ's failed registry"
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["completion_tokens"] == 150
    assert [(j["status"], j["attempts"], j["worker"]) for j in others] == [("succeeded", 1, worker_name)] * 3
    assert after["status"] == "succeeded"
    assert failed_registry == 0 and spool_left == set()


def test_outcomes_finished_during_an_outage_survive_their_workers_death(outage_system, database):
    processes = outage_system
    _api, url = processes.start_api()
    worker, worker_name = processes.start_worker()
    redis = Redis.from_url(processes.redis_url)
    with processes.client(url) as client:
        job = client.submit(LONG | {"max_tokens": 100})
        wait_until(lambda: client.job(job["id"])["status"] == "running", "the generation never started")
        database.stop()
        wait_until(lambda: job["id"].encode() in _spooled(redis, worker_name), "the outcome was never spooled")
        worker.kill()  # SIGKILL while its outcome is unwritten: only the spool has it
        database.start()
        time.sleep(11)  # the dead worker's key expires (TTL 10 s)
        report = reconcile(processes)
        done = client.job(job["id"])
    redis.close()
    assert report.spooled == [job["id"]] and report.recovered == []  # written, not run again
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["completion_tokens"] == 100
    assert done["worker"] == worker_name


def _proxied(database_url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(database_url)
    return parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()


CLAIM_SQL = b"attempts=(jobs.attempts + "  # only the claim's UPDATE sets attempts this way


POSTGRES_ONLY = pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)


@POSTGRES_ONLY
def test_a_claim_whose_acknowledgement_is_lost_is_adopted_by_its_worker(processes):
    parts = urlsplit(processes.database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    _api, url = processes.start_api()
    processes.settings["GPUQ_DATABASE_URL"] = _proxied(processes.database_url, proxy)
    _worker, worker_name = processes.start_worker()
    proxy.lose_reply_to_commit_after(CLAIM_SQL)
    with processes.client(url) as client:
        job = client.submit(NOOP)
        done = client.wait(job["id"], timeout_s=60)
    proxy.close()
    assert proxy.tripped.is_set(), "the claim's COMMIT never went through the trap"
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["worker"] == worker_name


@POSTGRES_ONLY
def test_a_claim_lost_on_the_wire_while_another_worker_takes_the_job_is_run_once(processes):
    # Long queue refreshes: each worker stays in one BLPOP, so Redis serves the longest waiting first.
    processes.settings |= {"GPUQ_WORKER_REFRESH_INTERVAL_S": "60", "GPUQ_WORKER_TTL_S": "180"}
    parts = urlsplit(processes.database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    redis = Redis.from_url(processes.redis_url)
    _api, url = processes.start_api()
    processes.settings["GPUQ_DATABASE_URL"] = _proxied(processes.database_url, proxy)
    _claimer, claimer_name = processes.start_worker("claimer")
    wait_until(lambda: blocked_in_blpop(redis) == 1, "the first worker never waited on its queues")
    del processes.settings["GPUQ_DATABASE_URL"]
    other, _other_name = processes.start_worker("other")
    wait_until(lambda: blocked_in_blpop(redis) == 2, "the second worker never waited on its queues")
    proxy.lose_reply_to_commit_after(CLAIM_SQL)
    with processes.client(url) as client:
        job = client.submit(NOOP)
        # The claimer's claim commits unheard; it puts the job back, the other worker takes it
        # and finds it running on the claimer, which will never run it: an orphan.
        wait_until(lambda: "no longer queued" in other.log.read_text(), "the other worker never skipped the job")
        orphaned = client.job(job["id"])
        report = reconcile(processes, orphan_limit_s=0.0)
        done = client.wait(job["id"], timeout_s=60)
    proxy.close()
    redis.close()
    assert proxy.tripped.is_set()
    assert orphaned["status"] == "running" and orphaned["worker"] == claimer_name
    assert report.orphaned == [job["id"]]
    assert done["status"] == "succeeded" and done["attempts"] == 1  # run once, its lost claim not charged
