"""Rebuilding Redis from SQL: the reason no job is ever lost.

Two repairs, both safe to run from any number of processes at once (the worker's
conditional claim makes a duplicate queue entry harmless):

* a row SQL says is ``queued`` but Redis has no live entry for (Redis restarted empty,
  or the API died between its commit and its enqueue) is enqueued again;
* a row SQL says is ``running`` on a worker whose heartbeat has expired goes back to
  the queue, or fails once it has used up its attempts. Jobs that died together on one
  worker are not charged the attempt and run alone next (``RUN_ALONE_KEY``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from redis import Redis
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.jobs.queues import QueueEntry
from gpuq.redis_keys import RUN_ALONE_KEY, RUN_ALONE_TTL_S, rq_job_key, rq_worker_key
from gpuq.stats import metrics

log = logging.getLogger(__name__)

LIVE_RQ_STATUSES = frozenset({b"queued", b"started"})


@dataclass
class ReconcileReport:
    requeued: list[str] = field(default_factory=list)  # queued in SQL, missing in Redis
    recovered: list[str] = field(default_factory=list)  # running on a dead worker, queued again
    failed: list[str] = field(default_factory=list)  # running on a dead worker, out of attempts


def reconcile_once(
    session: Session, redis: Redis, *, grace_s: float, max_attempts: int, timeout_s: int
) -> ReconcileReport:
    report = ReconcileReport()
    _requeue_lost_entries(session, redis, grace_s=grace_s, timeout_s=timeout_s, report=report)
    _recover_from_dead_workers(session, redis, max_attempts=max_attempts, timeout_s=timeout_s, report=report)
    if report.requeued or report.recovered or report.failed:
        log.warning(
            "reconciler: %d re-enqueued, %d recovered from dead workers, %d failed",
            len(report.requeued),
            len(report.recovered),
            len(report.failed),
        )
    return report


def _requeue_lost_entries(
    session: Session, redis: Redis, *, grace_s: float, timeout_s: int, report: ReconcileReport
) -> None:
    # Young rows may be between the API's commit and its enqueue; leave them a moment.
    queued = store.queued_jobs_created_before(session, utcnow() - timedelta(seconds=grace_s))
    if not queued:
        return
    with redis.pipeline(transaction=False) as pipe:
        for entry in queued:
            pipe.hget(rq_job_key(entry.job_id), "status")
        statuses = pipe.execute()
    lost = [entry for entry, status in zip(queued, statuses, strict=True) if status not in LIVE_RQ_STATUSES]
    if lost:
        enqueue_jobs(redis, lost, timeout_s=timeout_s)
        report.requeued.extend(e.job_id for e in lost)


def _live_workers(redis: Redis, names: set[str]) -> set[str]:
    ordered = sorted(names)
    with redis.pipeline(transaction=False) as pipe:
        for name in ordered:
            key = rq_worker_key(name)
            pipe.exists(key)
            pipe.hexists(key, "death")
        flags = pipe.execute()
    return {name for name, exists, dead in zip(ordered, flags[::2], flags[1::2], strict=True) if exists and not dead}


def _recover_from_dead_workers(
    session: Session, redis: Redis, *, max_attempts: int, timeout_s: int, report: ReconcileReport
) -> None:
    running = store.running_jobs(session)
    if not running:
        return
    alive = _live_workers(redis, {r.worker for r in running if r.worker})
    died_with = Counter(job.worker for job in running if job.worker not in alive)
    back: list[QueueEntry] = []
    alone: list[str] = []
    for job in running:
        if job.worker in alive:
            continue
        entry, worker = job.entry, job.worker
        if died_with[worker] > 1:
            # Several jobs went down together (continuous batching): which one crashed the
            # worker is unknown, so none is charged; each runs alone next, where a job that
            # crashes its worker again is charged as usual.
            if store.return_to_queue(session, entry.job_id, worker=worker, refund_attempt=True):
                back.append(entry)
                alone.append(entry.job_id)
        elif job.attempts >= max_attempts:
            _give_up(session, redis, job, report)
        elif store.return_to_queue(session, entry.job_id, worker=worker):
            back.append(entry)
    if alone:
        _mark_run_alone(redis, alone)
    if back:
        enqueue_jobs(redis, back, timeout_s=timeout_s)
        report.recovered.extend(e.job_id for e in back)


def _give_up(session: Session, redis: Redis, job: store.RunningJob, report: ReconcileReport) -> None:
    entry, worker = job.entry, job.worker
    error = f"worker {worker} stopped responding while running this job; gave up after {job.attempts} attempts"
    if store.fail_abandoned_job(session, entry.job_id, worker=worker, error=error):
        report.failed.append(entry.job_id)
        metrics.record_finished_jobs(redis, [metrics.FinishedJob(entry.model, entry.kind, JobStatus.FAILED.value)])


def _mark_run_alone(redis: Redis, job_ids: list[str]) -> None:
    with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(RUN_ALONE_KEY, *job_ids)
        pipe.expire(RUN_ALONE_KEY, RUN_ALONE_TTL_S)
        pipe.execute()
