"""Retry, requeue, and bulk retry or cancel: jobs put back to work, or stopped, after submission.

* **Retry** (owner or admin): a ``failed`` or ``cancelled`` job is queued again under the
  same id, as a fresh run (error, result and timings cleared; ``attempts`` kept), SQL first,
  then Redis, as submissions are. A job of a batch may be retried while the batch is in
  progress, not once it is finalised (its output files are written).
* **Requeue** (admin): a ``queued`` job whose Redis entry is gone is pushed again; a
  ``running`` job on a worker the admin knows is stuck goes back to ``queued`` (not a
  user cancel: no cancel is recorded) and the worker is told to stop it. SQL decides the
  race with the worker's outcome write: both UPDATEs are conditional on the row still
  running on that worker, so either the requeue wins (the late outcome is discarded) or
  the outcome does (the requeue answers 409 with the job's final status).
* **Bulk** retry or cancel: every job matching a filter, at most ``MAX_BULK_JOBS`` a call.
* **A revoked key's jobs** (``DELETE /v1/keys/{id}?cancel_jobs=true``): all of them
  cancelled, queued and running, however many.

If Redis fails after SQL has changed, the rows are ``queued`` with no Redis entry: the
reconciler enqueues them, as it does for any such row, and the caller gets a 503 saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from anyio import to_thread
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.db.tables import Job, JobStatus
from gpuq.errors import RequestError, unavailable
from gpuq.fleet.workers import stop_requeued_job
from gpuq.jobs.cancel import signal_worker
from gpuq.jobs.enqueue import enqueue_jobs, remove_queued
from gpuq.queue_names import QueueEntry
from gpuq.redis_keys import rq_job_key, rq_queue_key
from gpuq.stats import metrics
from gpuq.store.job_actions import RETRYABLE

MAX_BULK_JOBS = 10_000


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    matched: int  # jobs the filter selects
    changed: int  # of those, the ones this call retried or cancelled


async def _enqueue(redis: Redis, entries: list[QueueEntry], *, timeout_s: int) -> None:
    if not entries:
        return
    try:
        await to_thread.run_sync(lambda: enqueue_jobs(redis, entries, timeout_s=timeout_s))
    except RedisError as exc:
        raise unavailable(
            f"{len(entries)} job(s) are queued in SQL, but the job queue (Redis) is unreachable ({exc}); "
            "the reconciler enqueues them once Redis answers, so do not retry",
            code="queue_unavailable",
        ) from None


async def _reload(db: AsyncSession, job_id: str) -> Job:
    db.expire_all()
    job = await db.run_sync(store.get_job, job_id)
    assert job is not None  # jobs are never deleted once accepted
    return job


async def _refuse_closed_batch(db: AsyncSession, job: Job, action: str) -> None:
    if job.batch_id is None:
        return
    status = await db.run_sync(store.batch_status, job.batch_id)
    if status != "in_progress":
        raise RequestError(
            409,
            f"job {job.id} belongs to batch {job.batch_id}, which is {status}; a batch's jobs can be "
            f"{action} only while it is in progress (submit its failed lines as a new batch)",
        )


async def retry_job(db: AsyncSession, redis: Redis, job: Job, *, timeout_s: int) -> Job:
    if job.status not in RETRYABLE:
        why = {
            JobStatus.QUEUED: "it is already queued",
            JobStatus.RUNNING: "it is running",
            JobStatus.SUCCEEDED: "it succeeded; submit a new job to run it again",
        }.get(JobStatus(job.status), f"it is {job.status}")
        raise RequestError(409, f"job {job.id} cannot be retried: {why}. Only failed or cancelled jobs can be")
    await _refuse_closed_batch(db, job, "retried")
    changed = await db.run_sync(store.retry_finished_jobs, [job.id])
    if not changed:  # someone else retried (or the batch closed) between our read and the UPDATE
        now = await _reload(db, job.id)
        raise RequestError(409, f"job {job.id} is {now.status} now; it was changed by another request")
    await _enqueue(redis, changed, timeout_s=timeout_s)
    return await _reload(db, job.id)


def _queue_entry_present(redis: Redis, job_id: str) -> bool:
    """Is the job waiting in Redis: its RQ hash queued and its id in the queue it names
    (``origin``: aging may have moved it up), or already taken by a worker?"""
    # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
    status, origin = cast(list[bytes | None], redis.hmget(rq_job_key(job_id), "status", "origin"))
    if status == b"started":
        return True
    if status != b"queued" or origin is None:
        return False
    return redis.lpos(rq_queue_key(origin.decode()), job_id) is not None


async def requeue_job(db: AsyncSession, redis: Redis, job: Job, *, timeout_s: int) -> tuple[Job, str]:
    """Returns the job and what was done, in words."""
    entry = QueueEntry.of(job)
    if job.status == JobStatus.QUEUED:
        if await to_thread.run_sync(lambda: _queue_entry_present(redis, job.id)):
            return job, "already waiting in its queue; nothing to do"
        await to_thread.run_sync(lambda: remove_queued(redis, [entry]))  # a stale hash, if any
        await _enqueue(redis, [entry], timeout_s=timeout_s)
        return await _reload(db, job.id), "its queue entry was missing; enqueued again"
    if job.status != JobStatus.RUNNING:
        hint = " (use retry)" if job.status in RETRYABLE else ""
        raise RequestError(409, f"job {job.id} is {job.status}; only queued or running jobs can be requeued{hint}")
    if job.cancel_requested_at is not None:
        raise RequestError(409, f"job {job.id} is being cancelled; it cannot be requeued")
    await _refuse_closed_batch(db, job, "requeued")
    worker = job.worker
    if not await db.run_sync(lambda s: store.requeue_running_job(s, job.id, worker=worker)):
        now = await _reload(db, job.id)
        raise RequestError(409, f"job {job.id} is {now.status} now: its run ended before the requeue")
    if worker:
        await to_thread.run_sync(lambda: stop_requeued_job(redis, worker, job.id))
    await _enqueue(redis, [entry], timeout_s=timeout_s)
    return await _reload(db, job.id), f"taken back from worker {worker} (told to stop it) and queued again"


async def _matching(db: AsyncSession, flt: store.JobFilter) -> list[str]:
    matched = await db.run_sync(store.count_matching_jobs, flt)
    if matched > MAX_BULK_JOBS:
        raise RequestError(
            422,
            f"{matched} jobs match; one call changes at most {MAX_BULK_JOBS}. Narrow the filter "
            "(created_before/created_after, model, kind, priority) and repeat; nothing was changed",
        )
    return await db.run_sync(lambda s: store.matching_job_ids(s, flt, limit=MAX_BULK_JOBS))


async def retry_matching(db: AsyncSession, redis: Redis, flt: store.JobFilter, *, timeout_s: int) -> BulkOutcome:
    ids = await _matching(db, flt)
    changed = await db.run_sync(store.retry_finished_jobs, ids)
    await _enqueue(redis, changed, timeout_s=timeout_s)
    return BulkOutcome(len(ids), len(changed))


async def cancel_matching(db: AsyncSession, redis: Redis, flt: store.JobFilter) -> BulkOutcome:
    """Queued jobs are cancelled at once; running ones are asked to stop at their next token
    (they end ``cancelled`` when their worker has stopped them), as single cancels are."""
    return await _cancel(db, redis, await _matching(db, flt))


async def _cancel(db: AsyncSession, redis: Redis, ids: list[str]) -> BulkOutcome:
    cancelled = await db.run_sync(store.cancel_queued_jobs, ids)
    stopping = await db.run_sync(store.request_cancel_of_running_jobs, ids)

    def tell_redis() -> None:
        remove_queued(redis, cancelled)
        # Counted as single cancels are; a running job is counted when its worker stops it.
        metrics.record_finished_jobs(
            redis, [metrics.FinishedJob(e.model, e.kind, JobStatus.CANCELLED.value) for e in cancelled]
        )
        for job_id, worker in stopping:
            signal_worker(redis, job_id, worker)

    await to_thread.run_sync(tell_redis)
    return BulkOutcome(len(ids), len(cancelled) + len(stopping))


async def cancel_jobs_of_key(db: AsyncSession, redis: Redis, key_id: str) -> BulkOutcome:
    """Every queued or running job a key submitted (its batches' included), once it is revoked.

    The key is revoked first, so no new job of it can be committed (``gpuq.jobs.limits``
    refuses a submission that finds it revoked): queued jobs are taken a chunk at a time
    until none is left, then the running ones are asked to stop, which also reaches those
    a worker claimed while the queued ones were being cancelled.
    """
    try:
        return await _cancel_all_of_key(db, redis, key_id)
    except RedisError as exc:
        raise unavailable(
            f"key {key_id} is revoked, but the job queue (Redis) is unreachable ({exc}): its queued jobs may "
            "still be listed there and its running jobs were not told to stop; repeat this call once Redis answers",
            code="queue_unavailable",
        ) from None


async def _cancel_all_of_key(db: AsyncSession, redis: Redis, key_id: str) -> BulkOutcome:
    queued = store.JobFilter(statuses=(JobStatus.QUEUED.value,), api_key_id=key_id)
    matched = changed = 0
    while ids := await db.run_sync(lambda s: store.matching_job_ids(s, queued, limit=MAX_BULK_JOBS)):
        outcome = await _cancel(db, redis, ids)
        matched, changed = matched + outcome.matched, changed + outcome.changed
    # Every running one is signalled, also those a call before asked to stop: that call's
    # signal may be the one Redis never got.
    running = await db.run_sync(store.running_jobs_of_key, key_id)
    marked = await db.run_sync(store.request_cancel_of_running_jobs, [job_id for job_id, _ in running])

    def tell_workers() -> None:
        for job_id, worker in running:
            signal_worker(redis, job_id, worker)

    await to_thread.run_sync(tell_workers)
    return BulkOutcome(matched + len(running), changed + len(marked))
