"""A Redis outage under a running system: a private redis-server (append-only file on)
stopped while a generation runs and started again on the same port."""

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
