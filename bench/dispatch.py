"""Dispatch overhead: no-op jobs per second through gpuq against plain RQ, same Redis, same run.

gpuq: jobs submitted over HTTP in bulk requests, run by one `gpuq worker` process, every
job's history (claim, start, finish, worker, timings) written to SQL.
Plain RQ: the same number of jobs enqueued with `Queue.enqueue_many`, run by one
`rq.SimpleWorker` process calling a no-op function, results kept in Redis as RQ does.
Each side's clock starts at the first submission and stops when the last job is done;
both workers are already started and waiting.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.registry import FinishedJobRegistry
from sqlalchemy import func, select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

BULK_SIZE = 500
POLL_S = 0.05
PLAIN_QUEUE = "bench-plain-rq"


def noop() -> None:
    """The plain-RQ job: nothing, like gpuq's `noop` kind."""


@dataclass
class DispatchResult:
    jobs: int
    seconds: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def run_plain_rq(redis_url: str, jobs: int) -> DispatchResult:
    redis = Redis.from_url(redis_url)
    queue = Queue(PLAIN_QUEUE, connection=redis)
    worker = subprocess.Popen(
        [sys.executable, "-c", _PLAIN_WORKER, redis_url, PLAIN_QUEUE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)  # let it start and block on the queue
    finished = FinishedJobRegistry(queue=queue)
    started = time.perf_counter()
    for offset in range(0, jobs, BULK_SIZE):
        batch = [Queue.prepare_data(noop) for _ in range(min(BULK_SIZE, jobs - offset))]
        with redis.pipeline() as pipe:
            queue.enqueue_many(batch, pipeline=pipe)
            pipe.execute()
    while finished.count < jobs:
        time.sleep(POLL_S)
    elapsed = time.perf_counter() - started
    worker.terminate()
    worker.wait()
    redis.close()
    return DispatchResult(jobs, elapsed)


_PLAIN_WORKER = """
import sys
from redis import Redis
from rq import Queue, SimpleWorker
redis = Redis.from_url(sys.argv[1])
SimpleWorker([Queue(sys.argv[2], connection=redis)], connection=redis).work()
"""


def run_gpuq(database_url: str, redis_url: str, workdir: Path, jobs: int) -> DispatchResult:
    processes = GpuqProcesses(database_url, redis_url, workdir, settings={"GPUQ_MAX_JOBS_PER_REQUEST": "1000"})
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        with processes.client(url) as client:
            client.wait(client.submit({"kind": "noop", "model": BUNDLED_MODEL_NAME})["id"])  # warm both
            with sessions() as session:
                before = session.scalar(select(func.count()).select_from(Job).where(Job.status == "succeeded")) or 0
            started = time.perf_counter()
            for offset in range(0, jobs, BULK_SIZE):
                n = min(BULK_SIZE, jobs - offset)
                client.submit_many([{"kind": "noop", "model": BUNDLED_MODEL_NAME}] * n)
            while True:
                with sessions() as session:
                    done = session.scalar(select(func.count()).select_from(Job).where(Job.status == "succeeded")) or 0
                if done - before >= jobs:
                    break
                time.sleep(POLL_S)
            elapsed = time.perf_counter() - started
    finally:
        processes.stop_all()
        engine.dispose()
    return DispatchResult(jobs, elapsed)
