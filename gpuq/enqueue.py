"""Putting jobs into Redis with RQ: one pipeline for any number of jobs.

The RQ job id is the gpuq job id, and the RQ job carries only that id: the request
itself lives in SQL, the system of record, so Redis never holds a second copy that
could drift. ``result_ttl=0`` because results are written to SQL, not to Redis.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from redis import Redis
from rq import Queue

from gpuq.queues import JOB_FUNC, Priority, queue_name

FAILURE_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class QueueEntry:
    job_id: str
    model: str
    kind: str
    priority: int

    @property
    def queue(self) -> str:
        return queue_name(self.model, self.kind, Priority(self.priority))


def enqueue_jobs(redis: Redis, entries: Iterable[QueueEntry], *, timeout_s: int) -> None:
    """Enqueue every entry in a single Redis round trip (MULTI/EXEC, all or nothing)."""
    by_queue: dict[str, list[QueueEntry]] = defaultdict(list)
    for entry in entries:
        by_queue[entry.queue].append(entry)
    with redis.pipeline(transaction=True) as pipe:
        for name, queued in by_queue.items():
            queue = Queue(name, connection=redis)
            queue.enqueue_many(
                [
                    Queue.prepare_data(
                        JOB_FUNC,
                        args=(e.job_id,),
                        job_id=e.job_id,
                        timeout=timeout_s,
                        result_ttl=0,
                        failure_ttl=FAILURE_TTL_S,
                        description=f"gpuq {e.job_id}",
                    )
                    for e in queued
                ],
                pipeline=pipe,
            )
        pipe.execute()


def remove_queued(redis: Redis, entries: Iterable[QueueEntry]) -> None:
    """Take jobs out of their queues (cancelled before a worker took them)."""
    with redis.pipeline(transaction=True) as pipe:
        for e in entries:
            queue = Queue(e.queue, connection=redis)
            pipe.lrem(queue.key, 0, e.job_id)
            pipe.delete(f"{queue.job_class.redis_job_namespace_prefix}{e.job_id}")
        pipe.execute()


def job_keys_exist(redis: Redis, job_ids: list[str]) -> list[bool]:
    """Which jobs still have an RQ job hash (and so a queue entry or a running execution)."""
    with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(f"{Queue.job_class.redis_job_namespace_prefix}{job_id}")
        return [bool(n) for n in pipe.execute()]
