"""Soak: many no-op jobs through the API and two workers, watching what grows.

Not a CI test: 100,000 jobs take a quarter of an hour or more on two cores. It reports

* throughput: jobs submitted in bulk requests of ``BULK_SIZE`` while two `gpuq worker`
  processes run them, from the first submission to the last recorded success;
* submit latency: single-job submissions (``POST /v1/jobs``) sent one after another beside
  the bulk load, p50 and p99;
* Redis bytes per queued job: ``used_memory`` with ``QUEUED_SAMPLE`` jobs queued and no worker
  running, against an empty db;
* memory: the RSS of the API and of each worker after a warm-up and at the end, and Redis's
  ``used_memory`` once every job is done (what finished jobs leave behind).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import quantiles

from redis import Redis
from sqlalchemy import func, select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

BULK_SIZE = 500
QUEUED_SAMPLE = 20_000
NOOP = {"kind": "noop", "model": BUNDLED_MODEL_NAME}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class SoakResult:
    jobs: int
    seconds: float
    submit_latencies_s: list[float]
    redis_bytes_per_queued_job: float
    redis_bytes_after: int  # used_memory with every job done, over the empty db's
    api_rss_mib: tuple[float, float]  # after warm-up, at the end
    worker_rss_mib: list[tuple[float, float]] = field(default_factory=list)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    def latency_ms(self, pct: int) -> float:
        return quantiles(self.submit_latencies_s, n=100, method="inclusive")[pct - 1] * 1000


def run_soak(database_url: str, redis_url: str, workdir: Path, jobs: int) -> SoakResult:
    processes = GpuqProcesses(database_url, redis_url, workdir, settings={"GPUQ_MAX_JOBS_PER_REQUEST": "1000"})
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    redis = Redis.from_url(redis_url)

    def succeeded() -> int:
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(Job).where(Job.status == "succeeded")) or 0

    try:
        api, url = processes.start_api()
        with processes.client(url) as client:
            empty = redis.info("memory")["used_memory"]
            for offset in range(0, QUEUED_SAMPLE, BULK_SIZE):  # queued, with no worker to take them
                client.submit_many([NOOP] * min(BULK_SIZE, QUEUED_SAMPLE - offset))
            per_queued = (redis.info("memory")["used_memory"] - empty) / QUEUED_SAMPLE
            workers = [processes.start_worker(f"soak{i}")[0] for i in range(2)]
            while succeeded() < QUEUED_SAMPLE:  # the sample drained: the warm-up
                time.sleep(0.2)
            rss_start = [rss_mib(api.popen.pid)] + [rss_mib(w.popen.pid) for w in workers]
            before = succeeded()

            latencies: list[float] = []
            done_submitting = threading.Event()

            def sample_latency() -> None:
                with processes.client(url) as single:
                    while not done_submitting.is_set():
                        sent = time.perf_counter()
                        single.submit(NOOP)
                        latencies.append(time.perf_counter() - sent)

            sampler = threading.Thread(target=sample_latency)
            started = time.perf_counter()
            sampler.start()
            for offset in range(0, jobs, BULK_SIZE):
                client.submit_many([NOOP] * min(BULK_SIZE, jobs - offset))
            done_submitting.set()
            sampler.join()
            total = jobs + len(latencies)
            while succeeded() - before < total:
                time.sleep(0.2)
            elapsed = time.perf_counter() - started
            time.sleep(1)  # the outcome writers' last metrics, the final end-of-job writes
            rss_end = [rss_mib(api.popen.pid)] + [rss_mib(w.popen.pid) for w in workers]
            after = redis.info("memory")["used_memory"] - empty
    finally:
        processes.stop_all()
        engine.dispose()
        redis.close()
    return SoakResult(
        jobs=total,
        seconds=elapsed,
        submit_latencies_s=latencies,
        redis_bytes_per_queued_job=per_queued,
        redis_bytes_after=after,
        api_rss_mib=(rss_start[0], rss_end[0]),
        worker_rss_mib=list(zip(rss_start[1:], rss_end[1:], strict=True)),
    )
