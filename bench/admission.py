"""Admission by work (issue 42 item 4): what deadlines and token counts cost the queue.

One tenant's queue of ``jobs`` waiting generation jobs, on a real Redis and database, three
sides measured one after the other on fresh state:

* **plain**: jobs without a deadline, the queue as it was before deadlines (one RQ list);
* **one deadline**: every job with the same one, as a batch's lines have: each chunk of them
  goes at the end of the queue's deadline jobs, where nothing is behind it;
* **7 deadlines**: deadlines a second apart, the job ``i`` due ``i % 7`` seconds after the
  first: the worst case of the merge (``gpuq/jobs/enqueue.py``), each chunk's earliest job
  going in front of nearly every job already queued.

Reported for each: the enqueue (one ``enqueue_jobs`` call, the batch path) and the picks of
every job (``fair.Picker.take``) in jobs per second, and Redis's own time in their scripts
(``INFO commandstats``, reset with ``CONFIG RESETSTAT``: give the benchmark a Redis of its own),
which the other work on a shared machine does not blur; and, with the queue full, a position
behind all of them (its Redis and SQL halves, tokens counted from the rows) and the scrape's
query of the work waiting (``gpuq/stats/backlog.py``, every queued row summed) in
milliseconds, beside a plain ``count(*)`` of the queued rows as the floor such a query
cannot beat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

from redis import Redis
from sqlalchemy import delete, func, select

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, JobStatus, utcnow
from gpuq.jobs import fair
from gpuq.jobs.enqueue import _ENQUEUE, enqueue_jobs
from gpuq.jobs.position import job_position
from gpuq.queue_names import Priority, QueueEntry, band_name
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.stats.backlog import queued_tokens

OWNER = "acme"
CHUNK = 5000  # rows a statement


@dataclass(frozen=True)
class Side:
    enqueue_per_s: float
    enqueue_us: float  # Redis's own time a job queued (its scripts, from INFO commandstats)
    pick_per_s: float
    pick_us: float  # Redis's own time a pick
    position_ms: float
    backlog_ms: float
    count_ms: float


def _script_us(redis: Redis) -> float:
    """Redis's own time in scripts since its counters were last reset (``CONFIG RESETSTAT``),
    in microseconds: a figure the other processes on a shared machine do not blur."""
    stats = cast(dict[str, dict[str, float]], redis.info("commandstats"))
    return sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0.0) for c in ("evalsha", "eval"))


def _rows(n: int, *, deadlines: int) -> list[store.NewJob]:
    soon = utcnow() + timedelta(hours=24)
    ids = store.new_job_ids(n)
    return [
        store.NewJob(
            id=job_id,
            kind="generate",
            model=BUNDLED_MODEL_NAME,
            priority=Priority.LOW,
            request={"prompt": "x", "max_tokens": 64, "n": 1},
            request_hash="",
            prompt_tokens=100 + i % 50,
            owner=OWNER,
            deadline=soon + timedelta(seconds=i % deadlines) if deadlines else None,
        )
        for i, job_id in enumerate(ids)
    ]


def _ms(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(5):
        call()
    return (time.perf_counter() - start) / 5 * 1000


def run(database_url: str, redis_url: str, jobs: int, *, deadlines: int) -> Side:
    """``deadlines``: how many distinct deadlines the jobs have (0: none)."""
    redis = Redis.from_url(redis_url)
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            new = _rows(jobs, deadlines=deadlines)
            for start in range(0, jobs, CHUNK):
                store.insert_jobs(session, new[start : start + CHUNK])
            entries = [QueueEntry.of(j) for j in new]
            redis.script_load(_ENQUEUE)  # loaded before the counters are reset: only the calls count
            redis.config_resetstat()
            began = time.perf_counter()
            enqueue_jobs(redis, entries, timeout_s=600)
            enqueued = time.perf_counter() - began
            enqueue_us = _script_us(redis) / jobs

            last = session.get_one(Job, new[-1].id)
            position_ms = _ms(lambda: job_position(session, redis, last))
            backlog_ms = _ms(lambda: queued_tokens(session))
            count_ms = _ms(lambda: session.scalar(select(func.count()).where(Job.status == JobStatus.QUEUED)))

            picker = fair.Picker(redis, [band_name(BUNDLED_MODEL_NAME, "generate", Priority.LOW)])
            picker.peek()  # the script loaded
            redis.config_resetstat()
            began = time.perf_counter()
            taken = 0
            while picker.take() is not None:
                taken += 1
            picked = time.perf_counter() - began
            pick_us = _script_us(redis) / (taken + 1)  # and the last pick, which found nothing
            assert taken == jobs, f"picked {taken} of {jobs}"
            session.execute(delete(Job))  # a database given with --database-url is not fresh for the next side
            session.commit()
        return Side(jobs / enqueued, enqueue_us, jobs / picked, pick_us, position_ms, backlog_ms, count_ms)
    finally:
        engine.dispose()
        redis.close()
