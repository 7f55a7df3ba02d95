"""Cancelling a job: a queued one at once, a running one at its next token.

SQL decides the race with a worker: the queued-to-cancelled UPDATE and the worker's
queued-to-running claim are both conditional, so exactly one of them wins.
"""

from __future__ import annotations

import json

from anyio import to_thread
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.db.tables import Job, JobStatus
from gpuq.errors import RequestError
from gpuq.jobs.enqueue import remove_queued
from gpuq.queue_names import QueueEntry
from gpuq.redis_keys import CANCEL_FLAG_TTL_S, cancel_flag_key, rq_worker_channel
from gpuq.stats import metrics


async def cancel_job(db: AsyncSession, redis: Redis, job_id: str) -> Job:
    """Returns the job after the request: ``cancelled``, or ``running`` with cancel requested."""
    job = await _get(db, job_id)
    if job.status == JobStatus.QUEUED and await db.run_sync(store.cancel_queued_job, job_id):
        entry = QueueEntry.of(job)
        await to_thread.run_sync(lambda: remove_queued(redis, [entry]))
        cancelled = metrics.FinishedJob(job.model, job.kind, JobStatus.CANCELLED.value)
        await to_thread.run_sync(lambda: metrics.record_finished_jobs(redis, [cancelled]))
        return await _get(db, job_id)
    job = await _get(db, job_id)  # a worker may have claimed it meanwhile
    # SQL first: once signalled, the worker may record the job cancelled at once, and the
    # request must already be on the row by then.
    if job.status == JobStatus.RUNNING and await db.run_sync(store.mark_cancel_requested, job_id):
        await to_thread.run_sync(lambda: signal_worker(redis, job_id, job.worker))
        return await _get(db, job_id)
    job = await _get(db, job_id)
    raise RequestError(409, f"job {job_id} is already {job.status}; only queued or running jobs can be cancelled")


def signal_worker(redis: Redis, job_id: str, worker: str | None) -> None:
    """The flag is durable (the worker checks it with every heartbeat); the command on the
    worker's RQ pub/sub channel is immediate but may be missed, so both are sent."""
    with redis.pipeline(transaction=False) as pipe:
        pipe.set(cancel_flag_key(job_id), 1, ex=CANCEL_FLAG_TTL_S)
        if worker:
            pipe.publish(rq_worker_channel(worker), json.dumps({"command": "stop-job", "job_id": job_id}))
        pipe.execute()


async def _get(db: AsyncSession, job_id: str) -> Job:
    db.expire_all()
    job = await db.run_sync(store.get_job, job_id)
    if job is None:
        raise RequestError(404, f"job {job_id!r} does not exist")
    return job
