"""A Redis outage under a running system: a private redis-server (append-only file on)
stopped while a generation runs and started again on the same port."""

import json
import time

import httpx

from gpuq.local.redis_server import PrivateRedis
from gpuq.testing import GpuqProcesses
from tests.e2e.conftest import wait_until

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}


def test_a_redis_outage_shorter_than_the_worker_ttl_loses_nothing_and_runs_nothing_twice(tmp_path, database_url):
    redis_server = PrivateRedis(tmp_path / "redis", persist=True)
    redis_url = redis_server.start()
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_TTL_S": "30", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1"}
    try:
        _api, url = processes.start_api()
        worker, worker_name = processes.start_worker()
        headers = {"authorization": f"Bearer {processes.admin_key}"}
        with processes.client(url) as client, httpx.Client(base_url=url, headers=headers) as http:
            running = client.submit(LONG | {"max_tokens": 150})
            waiting = [client.submit(NOOP)["id"] for _ in range(3)]
            wait_until(lambda: client.job(running["id"])["status"] == "running", "the generation never started")

            redis_server.stop()
            during = {
                "submit": http.post("/v1/jobs", json=NOOP),
                "workers": http.get("/v1/workers"),
                "readyz": http.get("/readyz"),
            }
            read_during = http.get(f"/v1/jobs/{running['id']}")  # SQL still answers
            time.sleep(8)
            still_alive = worker.popen.poll() is None
            redis_server.start(port=redis_server.port)

            done = client.wait(running["id"], timeout_s=120)
            others = [client.wait(job_id, timeout_s=120) for job_id in waiting]
            after = client.wait(client.submit(NOOP)["id"], timeout_s=60)
    finally:
        processes.stop_all()
        redis_server.stop()

    for name, response in during.items():
        assert response.status_code == 503 and response.headers.get("retry-after") == "5", (name, response.text)
        assert response.headers["content-type"] == "application/json"
    assert read_during.status_code == 200
    assert still_alive, "the worker must ride out a Redis outage shorter than its TTL"
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["completion_tokens"] == 150
    assert [(j["status"], j["attempts"], j["worker"]) for j in others] == [("succeeded", 1, worker_name)] * 3
    assert after["status"] == "succeeded"


def test_a_redis_that_restarts_empty_mid_batch_is_rebuilt_and_the_batch_completes_once(tmp_path, database_url):
    from openai import OpenAI
    from sqlalchemy import select

    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.db.tables import Job

    redis_server = PrivateRedis(tmp_path / "redis", persist=False)  # no append-only file: it comes back empty
    redis_url = redis_server.start()
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    processes.settings |= {
        "GPUQ_WORKER_TTL_S": "10",
        "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "1",
        "GPUQ_WORKER_SLOTS": "2",
        "GPUQ_RECONCILE_INTERVAL_S": "1",
        "GPUQ_RECONCILE_GRACE_S": "1",
    }
    lines = [
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": MODEL, "prompt": f"Count from {i}:", "max_tokens": 60, "temperature": 0},
            }
        )
        for i in range(8)
    ]
    (tmp_path / "batch.jsonl").write_text("\n".join(lines) + "\n")
    try:
        _api, url = processes.start_api()
        processes.start_scheduler()
        _worker, worker_name = processes.start_worker()
        client = OpenAI(base_url=f"{url}/v1", api_key=processes.admin_key, max_retries=0)
        with (tmp_path / "batch.jsonl").open("rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, "no line finished", 180)

        redis_server.stop()  # mid-batch: lines done, running and queued
        redis_server.start(port=redis_server.port)  # back at once, with nothing in it

        deadline = time.monotonic() + 300
        while (done := client.batches.retrieve(batch.id)).status not in {"completed", "failed", "cancelled"}:
            assert time.monotonic() < deadline, f"batch still {done.status}: {done.request_counts}"
            time.sleep(0.5)
        output = [json.loads(row) for row in client.files.content(done.output_file_id).text.splitlines()]
        client.close()
        engine = sync_engine(database_url)
        with sync_sessions(engine)() as session:
            jobs = list(session.scalars(select(Job).where(Job.batch_id == batch.id)))
        engine.dispose()
    finally:
        processes.stop_all()
        redis_server.stop()

    assert done.status == "completed" and done.request_counts.completed == 8 and done.request_counts.failed == 0
    assert sorted(row["custom_id"] for row in output) == sorted(f"line-{i}" for i in range(8))  # each once
    assert [(j.status, j.attempts) for j in jobs] == [("succeeded", 1)] * 8  # none run twice
    assert {j.worker for j in jobs} == {worker_name}


def test_an_idle_worker_waits_out_a_redis_outage_with_one_warning_not_a_spin(tmp_path, database_url):
    """Its throttled housekeeping, which then reached no Redis, was taken for Redis answering:
    the backoff was reset at once and the idle loop spun through the outage, a warning and a
    traceback a millisecond (245,000 log lines in one 5 s outage of the stacked soak)."""
    redis_server = PrivateRedis(tmp_path / "redis", persist=True)
    redis_url = redis_server.start()
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    try:
        worker, _name = processes.start_worker()
        redis_server.stop()
        wait_until(lambda: "Redis is unreachable" in worker.log.read_text(), "the worker never noticed the outage")
        time.sleep(3)
        redis_server.start(port=redis_server.port)
        # It tries Redis again at least every RECONNECT_BACKOFF_MAX_S (2 s): back well within 10 s.
        wait_until(lambda: "Redis answers again" in worker.log.read_text(), "the worker never saw Redis back", 10)
        still_alive = worker.popen.poll() is None
    finally:
        processes.stop_all()
        redis_server.stop()
    log = worker.log.read_text()
    assert still_alive
    assert log.count("Redis is unreachable") == 1 and log.count("Redis answers again") == 1, log[-3000:]
