"""Faults between Redis handing out a job (or a bell's token) and the worker recording its start."""

import os
import signal

from redis import Redis

from gpuq.queue_names import Priority, band_name
from gpuq.redis_keys import fair_bell_key
from tests.e2e.conftest import blocked_in_blpop, reconcile, wait_until

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


def test_a_worker_that_froze_while_waiting_takes_nothing_and_the_job_runs_elsewhere_once(processes):
    """Plain RQ's BLPOP hands a job to a frozen worker's socket, where it sits unseen until the
    reconciler re-enqueues it. An idle gpuq worker blocks on its bands' bell instead
    (gpuq/jobs/fair.py): Redis hands the frozen worker a token, the job stays in its queue,
    and another worker takes it at once."""
    # A long queue refresh keeps the frozen worker's BLPOP pending for the whole test.
    processes.settings |= {"GPUQ_WORKER_REFRESH_INTERVAL_S": "60", "GPUQ_WORKER_TTL_S": "180"}
    _api, url = processes.start_api()
    frozen, frozen_name = processes.start_worker("frozen")
    redis = Redis.from_url(processes.redis_url)
    bell = fair_bell_key(band_name(MODEL, "noop", Priority.NORMAL))
    try:
        wait_until(lambda: blocked_in_blpop(redis), "the worker never waited on its queues")
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        with processes.client(url) as client:
            job = client.submit(NOOP)
            wait_until(lambda: blocked_in_blpop(redis) == 0, "Redis never answered the frozen worker's wait")
            assert redis.llen(bell) == 0  # the token went to the frozen worker's socket
            queue_key = f"rq:queue:gpuq:{MODEL}:noop:normal:admin"
            assert redis.lrange(queue_key, 0, -1) == [job["id"].encode()]  # the job did not
            assert reconcile(processes, in_flight_limit_s=0.0).requeued == []  # nothing was lost

            _survivor, survivor_name = processes.start_worker("survivor")
            done = client.wait(job["id"], timeout_s=60)

            # Thawed, it reads the stale token, finds nothing, and waits again.
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
    assert redis.llen(f"rq:queue:gpuq:{MODEL}:noop:normal:admin") == len(ids)  # no duplicate entry
    redis.close()
