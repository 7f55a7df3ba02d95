"""Faults between Redis handing out a job and the worker recording its start."""

import os
import signal
import time

from redis import Redis

from tests.e2e.conftest import blocked_in_blpop, reconcile, wait_until

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


def test_a_job_popped_by_a_worker_that_froze_before_starting_it_runs_elsewhere_once(processes):
    # A long queue refresh keeps the frozen worker's BLPOP pending for the whole test: Redis
    # pops the job for it and writes the reply into a socket nobody reads.
    processes.settings |= {"GPUQ_WORKER_REFRESH_INTERVAL_S": "60", "GPUQ_WORKER_TTL_S": "180"}
    _api, url = processes.start_api()
    frozen, frozen_name = processes.start_worker("frozen")
    redis = Redis.from_url(processes.redis_url)
    try:
        wait_until(lambda: blocked_in_blpop(redis), "the worker never waited on its queues")
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        with processes.client(url) as client:
            job = client.submit(NOOP)
            queue_key = f"rq:queue:gpuq:{MODEL}:noop:normal"
            wait_until(lambda: redis.llen(queue_key) == 0, "Redis never handed the job to the frozen worker")
            assert redis.hget(f"rq:job:{job['id']}", "status") == b"queued"  # what fooled the reconciler
            assert client.job(job["id"])["status"] == "queued"

            # The first pass only notes the job as in flight; a pass after the limit re-enqueues it.
            assert reconcile(processes, in_flight_limit_s=1.0).requeued == []
            time.sleep(1.1)
            assert reconcile(processes, in_flight_limit_s=1.0).requeued == [job["id"]]
            _survivor, survivor_name = processes.start_worker("survivor")
            done = client.wait(job["id"], timeout_s=60)

            # Thawed, it reads the stale reply, finds the job done and its hash gone, and waits again.
            wait_until(lambda: blocked_in_blpop(redis) == 1, "the survivor never went back to its queues")
            os.kill(frozen.popen.pid, signal.SIGCONT)
            wait_until(lambda: blocked_in_blpop(redis) == 2, "the thawed worker never went back to its queues")
            again = client.job(job["id"])
    finally:
        os.kill(frozen.popen.pid, signal.SIGCONT)
        redis.close()
    assert done["status"] == "succeeded" and done["worker"] == survivor_name != frozen_name
    assert again["attempts"] == 1 and again["worker"] == survivor_name  # run once, by the survivor


def test_a_job_in_its_queue_is_never_taken_for_lost(processes):
    _api, url = processes.start_api()
    with processes.client(url) as client:
        ids = [client.submit(NOOP)["id"] for _ in range(3)]
        for _ in range(2):  # passes that would re-enqueue a job seen in flight twice
            assert reconcile(processes, in_flight_limit_s=0.0).requeued == []
    redis = Redis.from_url(processes.redis_url)
    assert redis.llen(f"rq:queue:gpuq:{MODEL}:noop:normal") == len(ids)  # no duplicate entry
    redis.close()
