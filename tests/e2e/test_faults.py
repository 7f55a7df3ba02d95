"""Priority order and the failures a job system must survive, on real processes."""

import os
import shutil
import threading
import time

from redis import Redis
from rq.registry import StartedJobRegistry

from tests.e2e.conftest import reconcile

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
# At temperature 0 SmolLM2 keeps counting to max_tokens (about 60 tokens/s on two cores).
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}


def _wait_for_status(client, job_id, status, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if job["status"] == status:
            return job
        time.sleep(0.05)
    raise TimeoutError(f"{job_id} never became {status}; it is {job['status']}")


def test_higher_priority_jobs_run_first(processes):
    _api, url = processes.start_api()
    with processes.client(url) as client:
        low = [client.submit(NOOP | {"priority": "low"})["id"] for _ in range(3)]
        normal = [client.submit(NOOP | {"priority": "normal"})["id"] for _ in range(3)]
        high = [client.submit(NOOP | {"priority": "high"})["id"] for _ in range(3)]
        processes.start_worker()
        done = [client.wait(job_id) for job_id in low + normal + high]
    order = [job["id"] for job in sorted(done, key=lambda j: j["started_at"])]
    assert order == high + normal + low  # by priority, and first in first out within one


def test_a_redis_that_restarts_empty_is_rebuilt_from_sql(processes):
    _api, url = processes.start_api()
    with processes.client(url) as client:
        ids = [client.submit(NOOP | {"priority": p})["id"] for p in ("high", "normal", "low")]
        Redis.from_url(processes.redis_url).flushdb()  # Redis lost everything
        assert sorted(reconcile(processes).requeued) == sorted(ids)
        processes.start_worker()
        assert [client.wait(job_id)["status"] for job_id in ids] == ["succeeded"] * 3


def test_a_long_job_keeps_heartbeating_and_is_never_taken_for_abandoned(processes):
    processes.settings |= {"GPUQ_WORKER_TTL_S": "2", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}
    _api, url = processes.start_api()
    _worker, worker_name = processes.start_worker()
    redis = Redis.from_url(processes.redis_url)
    with processes.client(url) as client:
        # Long enough to outlive the TTL several times even at 150 tokens/s (CI runners vary).
        job = client.submit(LONG | {"max_tokens": 800})
        _wait_for_status(client, job["id"], "running")
        started = time.monotonic()
        while client.job(job["id"])["status"] == "running":
            # What a reconciler and RQ's own registry cleanup would do, many TTLs into the job.
            assert reconcile(processes).recovered == []
            StartedJobRegistry(f"gpuq:{MODEL}:generate:normal:admin", connection=redis).cleanup()
            time.sleep(0.5)
        ran_s = time.monotonic() - started
        done = client.wait(job["id"])
    redis.close()
    assert ran_s > 2 * 2, "the job should outlive its worker's TTL several times over"
    assert done["status"] == "succeeded" and done["attempts"] == 1 and done["worker"] == worker_name
    assert done["completion_tokens"] == 800


def test_a_job_on_a_crashed_worker_is_retried_on_another(processes):
    processes.settings |= {"GPUQ_WORKER_TTL_S": "2", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}
    _api, url = processes.start_api()
    crashing, crashed_name = processes.start_worker("doomed")
    with processes.client(url) as client:
        job = client.submit(LONG | {"max_tokens": 200})
        _wait_for_status(client, job["id"], "running")
        crashing.kill()  # SIGKILL: no cleanup, no goodbye
        time.sleep(2.5)  # the dead worker's key expires after its TTL
        assert reconcile(processes).recovered == [job["id"]]
        _survivor, survivor_name = processes.start_worker("survivor")
        done = client.wait(job["id"], timeout_s=120)
    assert done["status"] == "succeeded"
    assert done["attempts"] == 2 and done["worker"] == survivor_name != crashed_name


def test_a_model_file_that_fails_to_load_fails_its_job_and_the_worker_carries_on(processes, model_path):
    link = processes.workdir / "models" / "fragile.gguf"
    link.symlink_to(model_path)
    _api, url = processes.start_api()
    with processes.client(url) as client:
        client.register_model({"name": "fragile", "path": "fragile.gguf"})
        doomed = client.submit({"kind": "generate", "model": "fragile", "prompt": "hi", "max_tokens": 4})
        os.unlink(link)  # the file disappears before any worker loads it
        processes.start_worker()
        failed = client.wait(doomed["id"])
        after = client.wait(client.submit(NOOP)["id"])
        fine = client.wait(client.submit({"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4})["id"])
    assert failed["status"] == "failed" and "fragile.gguf" in failed["error"]
    assert after["status"] == fine["status"] == "succeeded"


def _damaged_copy(model_path: str, target) -> None:
    """The bundled model with its header intact and every tensor byte 0xFF: f16 scales of
    0xFFFF are NaN, so every weight is, as after a corrupted download or disk."""
    import gguf

    shutil.copyfile(model_path, target)
    data_start = min(t.data_offset for t in gguf.GGUFReader(target).tensors)
    with open(target, "r+b") as f:
        f.seek(data_start)
        f.write(b"\xff" * (os.path.getsize(target) - data_start))


def test_a_model_whose_weights_are_damaged_fails_its_jobs_with_the_reason(processes, model_path):
    _damaged_copy(model_path, processes.workdir / "models" / "damaged.gguf")
    _api, url = processes.start_api()
    processes.start_worker()
    with processes.client(url) as client:
        client.register_model({"name": "damaged", "path": "damaged.gguf", "kinds": ["generate", "embed"]})
        generate = client.submit({"kind": "generate", "model": "damaged", "prompt": "Hello", "max_tokens": 8})
        embed = client.submit({"kind": "embed", "model": "damaged", "input": ["one text", "another"]})
        failed = [client.wait(generate["id"]), client.wait(embed["id"])]
        fine = client.wait(client.submit({"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4})["id"])
    for job in failed:  # not an empty "success", not NaN vectors stored as invalid JSON
        assert job["status"] == "failed" and "weights are damaged" in job["error"], job
        assert job["result"] is None
    assert fine["status"] == "succeeded" and fine["completion_tokens"] > 0


def test_a_sigterm_lets_the_running_job_finish_before_the_worker_exits(processes):
    _api, url = processes.start_api()
    worker, _name = processes.start_worker()
    with processes.client(url) as client:
        job = client.submit(LONG | {"max_tokens": 64})
        _wait_for_status(client, job["id"], "running")
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        stopper.join(timeout=60)
        done = client.job(job["id"])
    assert worker.popen.returncode == 0
    assert done["status"] == "succeeded" and done["completion_tokens"] > 0
