"""An admin's (or an owner's) actions on jobs already submitted: retry, requeue, and the
bulk forms of retry and cancel over a ``JobFilter``.

Every change is a conditional UPDATE, so it races safely with workers (claims, outcome
writes), the reconciler and other admins: the database decides, and callers learn from
the returned rows what this call changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import ColumnElement, exists, func, or_, select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import Batch, BatchStatus, Job, JobStatus, RunOutcome, utcnow
from gpuq.queue_names import QueueEntry
from gpuq.store._sql import NO_SYNC, rows_changed
from gpuq.store.job_runs import record_run_end
from gpuq.store.jobs import QUEUE_ENTRY_COLUMNS, JobFilter, job_conditions, queue_entry

RETRYABLE = (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
CANCELLABLE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
_CHUNK = 500  # ids per statement: well under SQLite's bound-parameter limit

# A queued row carries nothing of an earlier run; ``attempts`` is kept on purpose (it
# counts every run, and bounds recoveries from dead workers), and ``prompt_tokens`` is the
# request's own count.
_NEW_RUN: dict[str, Any] = {
    "status": JobStatus.QUEUED.value,
    "error": None,
    "result": None,
    "started_at": None,
    "finished_at": None,
    "cancel_requested_at": None,
    "worker": None,
    "device": None,
    "host": None,
    "gpu_uuid": None,
    "completion_tokens": None,
    "load_ms": None,
    "run_ms": None,
    "gpu_seconds": None,
    "energy_j": None,
}


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


def _batch_open() -> ColumnElement[bool]:
    """Not part of a batch, or of one still in progress: a finalised batch's output files
    are written, so its jobs stay as they ended."""
    return or_(
        Job.batch_id.is_(None),
        exists().where(Batch.id == Job.batch_id, Batch.status == BatchStatus.IN_PROGRESS.value),
    )


def count_matching_jobs(session: Session, flt: JobFilter) -> int:
    return session.scalar(select(func.count()).select_from(Job).where(*job_conditions(flt))) or 0


def matching_job_ids(session: Session, flt: JobFilter, *, limit: int) -> list[str]:
    """Oldest first, at most ``limit``."""
    query = select(Job.id).where(*job_conditions(flt)).order_by(Job.created_at, Job.id).limit(limit)
    return list(session.scalars(query))


def retry_finished_jobs(session: Session, ids: Sequence[str]) -> list[QueueEntry]:
    """Failed or cancelled to queued, as a fresh run, for the ids still failed or cancelled
    and not of a finalised batch; returns those changed, to be enqueued."""
    changed: list[QueueEntry] = []
    for chunk in _chunks(ids):
        rows = session.execute(
            update(Job)
            .execution_options(**NO_SYNC)
            .where(Job.id.in_(chunk), Job.status.in_(RETRYABLE), _batch_open())
            .values(**_NEW_RUN)
            .returning(*QUEUE_ENTRY_COLUMNS)
        )
        changed += [queue_entry(r) for r in rows]
    session.commit()
    return changed


def requeue_running_job(session: Session, job_id: str, *, worker: str | None) -> bool:
    """Running on ``worker`` to queued, unless the run has ended or a cancel was asked for
    meanwhile: the worker's outcome write and this UPDATE are both conditional, so exactly
    one wins. Attempts stay counted (the stopped run was one)."""
    statement = (
        update(Job)
        .execution_options(**NO_SYNC)
        .where(
            Job.id == job_id,
            Job.status == JobStatus.RUNNING,
            Job.worker == worker,
            Job.cancel_requested_at.is_(None),
            _batch_open(),
        )
        .values(**_NEW_RUN)
    )
    changed = rows_changed(session, statement)
    if changed:
        record_run_end(session, job_id, worker=worker, outcome=RunOutcome.REQUEUED, reason="requeued by an admin")
    session.commit()
    return bool(changed)


def cancel_queued_jobs(session: Session, ids: Sequence[str]) -> list[QueueEntry]:
    """Queued to cancelled for the ids still queued; returns those changed (to take out of Redis)."""
    now = utcnow()
    changed: list[QueueEntry] = []
    for chunk in _chunks(ids):
        rows = session.execute(
            update(Job)
            .execution_options(**NO_SYNC)
            .where(Job.id.in_(chunk), Job.status == JobStatus.QUEUED)
            .values(status=JobStatus.CANCELLED.value, cancel_requested_at=now, finished_at=now)
            .returning(*QUEUE_ENTRY_COLUMNS)
        )
        changed += [queue_entry(r) for r in rows]
    session.commit()
    return changed


def request_cancel_of_running_jobs(session: Session, ids: Sequence[str]) -> list[tuple[str, str | None]]:
    """Record a cancel request on the ids running without one; returns (id, worker) to signal."""
    now = utcnow()
    changed: list[tuple[str, str | None]] = []
    for chunk in _chunks(ids):
        rows = session.execute(
            update(Job)
            .execution_options(**NO_SYNC)
            .where(Job.id.in_(chunk), Job.status == JobStatus.RUNNING, Job.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now)
            .returning(Job.id, Job.worker)
        ).all()
        changed += [(r.id, r.worker) for r in rows]
    session.commit()
    return changed


def batch_status(session: Session, batch_id: str) -> str | None:
    return session.scalar(select(Batch.status).where(Batch.id == batch_id))
