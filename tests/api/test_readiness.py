"""/readyz says whether any worker can take a job (no live worker, or all drained), while the
API itself stays ready: it accepts jobs either way, as before the first worker starts."""

from rq import Queue
from rq.worker import Worker

from gpuq.fleet.workers import set_worker_drain


def test_readyz_says_when_no_worker_can_take_a_job(client, redis):
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ok",
        "database": "ok",
        "redis": "ok",
        "disk": "ok",
        "workers": "none can take jobs: no live worker",
    }

    worker = Worker([Queue("gpuq:smollm2-135m:generate:high", connection=redis)], connection=redis, name="w1")
    worker.register_birth()
    assert client.get("/readyz").json()["workers"] == "1 can take jobs"

    assert set_worker_drain(redis, "w1", drained=True)
    assert client.get("/readyz").json()["workers"] == "none can take jobs: all 1 live workers are drained"

    worker.register_death()
    assert client.get("/readyz").json()["workers"] == "none can take jobs: no live worker"
