"""Retention: the history that ended before a cutoff, found and deleted a chunk at a time.

Each ``delete_*`` function is one short transaction of at most ``limit`` rows (the caller
loops until it returns 0), so a prune of millions of rows never holds long locks or a huge
undo log, and running workers, the API and the scheduler carry on beside it. Every
DELETE repeats its conditions on the rows it deletes, so a row that changed since it was
selected (a failed job retried a moment ago) is not deleted. ``count_*`` says what the
same conditions match, for a dry run.

What goes: finished jobs outside batches; finished batches with their jobs (a job's runs go
with it); files no remaining batch or schedule refers to; webhook deliveries that are no
longer pending; GPU samples; schedule runs. What stays: everything unfinished, and the stats rollups
(``job_stats_daily`` and its siblings), which hold the history's sums after its rows go.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, delete, exists, func, or_, select
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    FINAL_STATUSES,
    Batch,
    BatchStatus,
    DeliveryStatus,
    File,
    GpuSample,
    Job,
    JobRun,
    Schedule,
    ScheduleRun,
    WebhookDelivery,
)
from gpuq.store._sql import NO_SYNC, rows_changed

FINAL_JOB_STATUSES = tuple(s.value for s in FINAL_STATUSES)
FINAL_BATCH_STATUSES = tuple(
    s.value for s in (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
)
SETTLED_DELIVERIES = (DeliveryStatus.DELIVERED.value, DeliveryStatus.FAILED.value)


def _bounded_delete(session: Session, table: Any, key: Any, conditions: list[ColumnElement[bool]], limit: int) -> int:
    """Delete up to ``limit`` rows matching ``conditions``, commit, and say how many went."""
    chunk = select(key).where(*conditions).limit(limit).scalar_subquery()
    deleted = rows_changed(session, delete(table).where(key.in_(chunk), *conditions).execution_options(**NO_SYNC))
    session.commit()
    return deleted


def _count(session: Session, query: Select[Any]) -> int:
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


# ---------------------------------------------------------------- jobs outside batches


def _old_jobs(before: datetime) -> list[ColumnElement[bool]]:
    # ix_jobs_status_finished serves this: (status, finished_at).
    return [Job.status.in_(FINAL_JOB_STATUSES), Job.finished_at < before, Job.batch_id.is_(None)]


def count_finished_jobs(session: Session, *, before: datetime) -> int:
    return _count(session, select(Job.id).where(*_old_jobs(before)))


def delete_finished_jobs(session: Session, *, before: datetime, limit: int) -> int:
    """Jobs of no batch that reached a final status before ``before``."""
    return _delete_jobs_with_runs(session, _old_jobs(before), limit)


def _delete_jobs_with_runs(session: Session, conditions: list[ColumnElement[bool]], limit: int) -> int:
    """Up to ``limit`` jobs matching ``conditions`` and their runs (``job_runs``), in one transaction."""
    ids = list(session.scalars(select(Job.id).where(*conditions).limit(limit)))
    deleted = rows_changed(session, delete(Job).where(Job.id.in_(ids), *conditions).execution_options(**NO_SYNC))
    if deleted:  # the runs of those that went (one changed since the select stays, with its runs)
        gone = delete(JobRun).where(JobRun.job_id.in_(ids), ~exists().where(Job.id == JobRun.job_id))
        session.execute(gone.execution_options(**NO_SYNC))
    session.commit()
    return deleted


# ---------------------------------------------------------------- batches, with their jobs


def _ended_at() -> ColumnElement[Any]:
    return func.coalesce(Batch.completed_at, Batch.failed_at, Batch.expired_at, Batch.cancelled_at)


def _old_batches(before: datetime) -> list[ColumnElement[bool]]:
    # created_at is never after the end: it narrows the scan to ix_batches_created.
    return [Batch.status.in_(FINAL_BATCH_STATUSES), Batch.created_at < before, _ended_at() < before]


def finished_batches(session: Session, *, before: datetime, after: str, limit: int) -> list[str]:
    """Ids after ``after``, in order, of batches that ended (completed, failed, expired,
    cancelled) before ``before``."""
    query = select(Batch.id).where(Batch.id > after, *_old_batches(before)).order_by(Batch.id).limit(limit)
    return list(session.scalars(query))


def count_finished_batches(session: Session, *, before: datetime) -> tuple[int, int]:
    """Batches that ended before ``before``, and their jobs."""
    ids = select(Batch.id).where(*_old_batches(before))
    batches = _count(session, ids)
    jobs = _count(session, select(Job.id).where(Job.batch_id.in_(ids.scalar_subquery())))
    return batches, jobs


def delete_batch_jobs(session: Session, batch_id: str, *, limit: int) -> int:
    """Up to ``limit`` of a finished batch's jobs (all of them are final once it is)."""
    return _delete_jobs_with_runs(session, [Job.batch_id == batch_id], limit)


def delete_finished_batch(session: Session, batch_id: str, *, before: datetime) -> bool:
    """The batch row, once its jobs are gone; False if it no longer qualifies (or is gone)."""
    conditions = [Batch.id == batch_id, *_old_batches(before), ~exists().where(Job.batch_id == batch_id)]
    deleted = rows_changed(session, delete(Batch).where(*conditions).execution_options(**NO_SYNC))
    session.commit()
    return deleted == 1


# ---------------------------------------------------------------- files


def _unreferenced_files(before: datetime, *, but_by_finished_batches: bool = False) -> list[ColumnElement[bool]]:
    refers = or_(Batch.input_file_id == File.id, Batch.output_file_id == File.id, Batch.error_file_id == File.id)
    if but_by_finished_batches:  # as it will be once the batches that ended before the cutoff are gone
        refers = and_(refers, ~and_(*_old_batches(before)))
    used_by_schedule = exists().where(Schedule.input_file_id == File.id)
    return [File.created_at < before, ~exists().where(refers), ~used_by_schedule]


def count_unreferenced_files(session: Session, *, before: datetime) -> tuple[int, int]:
    """Files made before ``before`` that no batch or schedule will refer to once the batches
    that ended before it are gone, and their bytes."""
    conditions = _unreferenced_files(before, but_by_finished_batches=True)
    row = session.execute(select(func.count(), func.coalesce(func.sum(File.bytes), 0)).where(*conditions)).one()
    return int(row[0]), int(row[1])


def delete_unreferenced_files(session: Session, *, before: datetime, limit: int) -> list[tuple[str, int]]:
    """Up to ``limit`` such file rows; their (path, bytes), for the caller to remove from disk
    after this commit (a file left on disk by a failure there is harmless, a row without
    its file would not be). Run after the finished batches are deleted: a file any batch
    still refers to stays."""
    conditions = _unreferenced_files(before)
    chunk = select(File.id).where(*conditions).limit(limit).scalar_subquery()
    statement = delete(File).where(File.id.in_(chunk), *conditions).returning(File.path, File.bytes)
    removed = [(path, size) for path, size in session.execute(statement.execution_options(**NO_SYNC))]
    session.commit()
    return removed


# ---------------------------------------------------------------- webhook deliveries, samples, schedule runs


def _settled_deliveries(before: datetime) -> list[ColumnElement[bool]]:
    # A settled delivery's next_attempt_at is its last attempt, never before it was created:
    # ix_webhook_deliveries_due (status, next_attempt_at) serves this.
    return [WebhookDelivery.status.in_(SETTLED_DELIVERIES), WebhookDelivery.next_attempt_at < before]


def count_settled_deliveries(session: Session, *, before: datetime) -> int:
    return _count(session, select(WebhookDelivery.id).where(*_settled_deliveries(before)))


def delete_settled_deliveries(session: Session, *, before: datetime, limit: int) -> int:
    """Deliveries delivered or given up on before ``before``; pending ones stay."""
    return _bounded_delete(session, WebhookDelivery, WebhookDelivery.id, _settled_deliveries(before), limit)


def count_gpu_samples(session: Session, *, before: datetime) -> int:
    return _count(session, select(GpuSample.id).where(GpuSample.sampled_at < before))


def delete_gpu_samples(session: Session, *, before: datetime, limit: int) -> int:
    return _bounded_delete(session, GpuSample, GpuSample.id, [GpuSample.sampled_at < before], limit)


def count_schedule_runs(session: Session, *, before: datetime) -> int:
    return _count(session, select(ScheduleRun.id).where(ScheduleRun.fire_time < before))


def delete_schedule_runs(session: Session, *, before: datetime, limit: int) -> int:
    """Runs whose tick is before ``before``. A run's row guards its tick against a second
    firing only while schedulers may still fire it; once fired (or skipped), a schedule's
    next tick is after the time it was fired, so an old run's row guards nothing."""
    return _bounded_delete(session, ScheduleRun, ScheduleRun.id, [ScheduleRun.fire_time < before], limit)
