"""Two workers, prompt families: placement blind to the workers' caches against prefix-aware
placement (issue 42 item 2, ``gpuq/jobs/placement.py``).

The fleet: a supervisor with two CPU workers on simulated GPUs (``GPUQ_SIMULATED_GPUS=24,24``),
K slots each, the prefix cache's RAM tier at its default (or as ``--plan-ram-bytes`` sets it:
0 leaves each worker only its K slots, a fleet whose caches cannot each hold every family). The work, W3's shape
(``bench.peer.W3``): ``families`` prompt families, each its own ~450-token few-shot start,
``per_family`` questions each, interleaved, greedy, ``max_tokens`` each. Three workloads:

* **stream**: the lines submitted one request each, as fast as the client goes (what a
  service's callers send);
* **batch**: the same lines as one batch (``/v1/completions``), planned as by default;
* **distinct**: as many prompts of the same length that share no start (each line's first
  block made its own), one request each: nothing to reuse, so only the load guard speaks
  (target: within 5% of routing off).

Two sides per workload, one after the other on fresh state, same settings but one:
``GPUQ_PREFIX_ROUTING=off`` (every job in its band's shared queues: the placement gpuq had
before) and ``on``. Reported: the share of all prompt tokens the workers took from a cache
(``cached_tokens`` over ``prompt_tokens``, from SQL), jobs per second from the first submission
to the last job's finish, and how the jobs split over the two workers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.batch_plan import body, write_file
from bench.batch_plan import prompts as family_lines
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, utcnow
from gpuq.testing import GpuqProcesses

WORKLOADS = ("stream", "batch", "distinct")


@dataclass(frozen=True)
class Side:
    jobs: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    per_worker: tuple[int, ...]  # jobs each worker ran, most first

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def lines(workload: str, families: int, per_family: int) -> list[str]:
    """The prompts of a workload: W3's interleaved lines, or (``distinct``) the same lines each
    with a start of its own (a numbered first line: no block is shared)."""
    base = family_lines(families, per_family)
    if workload == "distinct":
        return [f"Ticket {i * 7919 % 10007}: answer briefly.\n{line}" for i, line in enumerate(base)]
    return base


def run(
    database_url: str,
    redis_url: str,
    workdir: Path,
    *,
    workload: str,
    routing: bool,
    families: int,
    per_family: int,
    max_tokens: int,
    slots: int,
    threads: int,
    ram_bytes: int = -1,
) -> Side:
    prompts = lines(workload, families, per_family)
    settings = {
        "GPUQ_SIMULATED_GPUS": "24,24",
        "GPUQ_WORKER_THREADS": str(threads),
        "GPUQ_WORKER_SLOTS": str(slots),
        "GPUQ_PREFIX_ROUTING": "on" if routing else "off",
        "GPUQ_WORKER_PREFIX_CACHE_RAM_BYTES": str(ram_bytes),
    }
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    try:
        _api, url = processes.start_api()
        processes.start_supervisor(expected_workers=2)
        with processes.client(url) as client:
            # Loads the model on both workers (prompts that share nothing with the work), so the
            # clock measures the work.
            warm = [{"kind": "generate", **body(f"Hello number {i}", 1)} for i in range(2 * slots)]
            for job in client.submit_many(warm):
                client.wait(job["id"])
            started = utcnow()
            if workload == "batch":
                path = workdir / "batch.jsonl"
                write_file(path, prompts, max_tokens)
                file_id = client.upload(str(path))["id"]
                batch_id = client.create_batch(file_id, endpoint="/v1/completions")["id"]
                where = Job.batch_id == batch_id
            else:
                ids = [client.submit({"kind": "generate", **body(p, max_tokens)})["id"] for p in prompts]
                where = Job.id.in_(ids)
            finished = _wait_finished(sessions, where, len(prompts))
        with sessions() as session:
            row = session.execute(
                select(func.count(), func.sum(Job.prompt_tokens), func.sum(Job.cached_tokens)).where(
                    where, Job.status == "succeeded"
                )
            ).one()
            workers = Counter(w for (w,) in session.execute(select(Job.worker).where(where)))
    finally:
        processes.stop_all()
        engine.dispose()
    jobs, prompt_tokens, cached = (int(v or 0) for v in row)
    assert jobs == len(prompts), f"{jobs} of {len(prompts)} jobs succeeded"
    return Side(
        jobs, prompt_tokens, cached, (finished - started).total_seconds(), tuple(sorted(workers.values())[::-1])
    )


def _wait_finished(sessions: sessionmaker[Session], where: object, count: int) -> datetime:
    """When the last job finished, polled rarely (the poller must not steal the CPU)."""
    done = select(func.count()).select_from(Job).where(where, Job.finished_at.is_not(None))  # type: ignore[arg-type]
    last = select(func.max(Job.finished_at)).where(where)  # type: ignore[arg-type]
    while True:
        with sessions() as session:
            if session.scalar(done) == count:
                finished: datetime = session.scalar(last)
                return finished
        time.sleep(1.0)
