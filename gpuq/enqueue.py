"""Putting jobs into Redis with RQ: one pipeline for any number of jobs.

The RQ job id is the gpuq job id, and the RQ job carries only that id: the request
itself lives in SQL, the system of record, so Redis never holds a second copy that
could drift. ``result_ttl=0`` because results are written to SQL, not to Redis.
"""

from __future__ import annotations

import pickle
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from redis import Redis
from rq import Queue
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.utils import now as rq_now
from rq.utils import utcformat

from gpuq.queues import JOB_FUNC, Priority, queue_name

FAILURE_TTL_S = 7 * 24 * 3600
PUSH_CHUNK = 1000


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
    """Enqueue every entry in one Redis round trip (MULTI/EXEC, all or nothing).

    Writes RQ's own job hash (the fields of ``rq.job.Job.to_dict`` that a worker reads,
    the call pickled and compressed as RQ does) and pushes ids onto RQ's queue lists, many
    per command. Going through ``Queue.enqueue_many`` instead costs about 10x more per job
    (a full ``Job`` object, every optional field, one push per job), which matters for a
    50,000-line batch; the result is the same data RQ's workers and tools read."""
    by_queue: dict[str, list[str]] = defaultdict(list)
    now = utcformat(rq_now())
    with redis.pipeline(transaction=True) as pipe:
        for entry in entries:
            name = entry.queue
            by_queue[name].append(entry.job_id)
            call = pickle.dumps((JOB_FUNC, None, (entry.job_id,), {}), protocol=pickle.HIGHEST_PROTOCOL)
            pipe.hset(
                RQJob.key_for(entry.job_id),
                mapping={
                    "data": zlib.compress(call),
                    "created_at": now,
                    "enqueued_at": now,
                    "origin": name,
                    "status": JobStatus.QUEUED.value,
                    "description": f"gpuq {entry.job_id}",
                    "timeout": timeout_s,
                    "result_ttl": 0,
                    "failure_ttl": FAILURE_TTL_S,
                },
            )
        for name, ids in by_queue.items():
            key = Queue.redis_queue_namespace_prefix + name
            pipe.sadd(Queue.redis_queues_keys, key)
            for start in range(0, len(ids), PUSH_CHUNK):
                pipe.rpush(key, *ids[start : start + PUSH_CHUNK])
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
