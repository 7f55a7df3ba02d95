"""Job runs: every claim of a job by a worker, and how that run ended.

A run starts in the claim's transaction and ends in the transaction that ends it (the
outcome's write, a return to the queue, an abandoned job given up on), so the history
and the job's row never disagree. ``jobs.attempts`` counts the attempts charged to the job
(a run refunded because it died beside others is taken back); these rows keep every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import JobRun, RunOutcome, utcnow
from gpuq.store._sql import NO_SYNC


def record_run_start(
    session: Session,
    *,
    job_id: str,
    attempt: int,
    worker: str,
    host: str | None,
    device: str | None,
    started_at: datetime,
) -> None:
    """A run of ``job_id`` on ``worker`` begins; committed with the claim that made it."""
    session.execute(
        insert(JobRun).values(
            job_id=job_id,
            attempt=attempt,
            worker=worker,
            host=host,
            device=device,
            started_at=started_at,
            refunded=False,
        )
    )


def record_run_end(
    session: Session,
    job_id: str,
    *,
    worker: str | None,
    outcome: RunOutcome,
    reason: str | None = None,
    refunded: bool = False,
    ended_at: datetime | None = None,
) -> None:
    """The open run of ``job_id`` on ``worker`` ends; committed with the change to the job's row
    that ended it (the caller's transaction)."""
    session.execute(
        update(JobRun)
        .execution_options(**NO_SYNC)
        .where(JobRun.job_id == job_id, JobRun.worker == worker, JobRun.ended_at.is_(None))
        .values(ended_at=ended_at or utcnow(), outcome=outcome.value, reason=reason, refunded=refunded)
    )


def runs_of_job(session: Session, job_id: str) -> Sequence[JobRun]:
    """Every run of the job, oldest first."""
    return session.scalars(select(JobRun).where(JobRun.job_id == job_id).order_by(JobRun.id)).all()
