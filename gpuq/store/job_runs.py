"""Job runs: every claim of a job by a worker, and how that run ended.

A run starts in the claim's transaction and ends in the transaction that ends it (the
outcome's write, a return to the queue, an abandoned job given up on), so the history
and the job's row never disagree. ``jobs.attempts`` counts the attempts charged to the job
(a run refunded because it died beside others is taken back); these rows keep every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import ColumnElement, ScalarSelect, Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import JobRun, RunOutcome, utcnow

# Built once on the table, not the ORM entity: a run starts and ends with every job a worker
# runs, and an ORM-enabled statement costs several times SQLite's own time (see jobs.py).
_RUNS = cast(Table, JobRun.__table__)
_RUN_START = (
    insert(_RUNS)
    .values(
        job_id=bindparam("r_job_id"),
        attempt=bindparam("r_attempt"),
        worker=bindparam("r_worker"),
        host=bindparam("r_host"),
        device=bindparam("r_device"),
        started_at=bindparam("r_started_at"),
        refunded=False,
    )
    .returning(_RUNS.c.id)
)
_RUN_END = (
    update(_RUNS)
    .where(_RUNS.c.job_id == bindparam("r_job_id"), _RUNS.c.worker == bindparam("r_worker"), _RUNS.c.ended_at.is_(None))
    .values(
        ended_at=bindparam("r_ended_at"),
        outcome=bindparam("r_outcome"),
        reason=bindparam("r_reason"),
        refunded=bindparam("r_refunded"),
    )
)


_RUN_END_BY_ID = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("r_id"), _RUNS.c.ended_at.is_(None))
    .values(ended_at=bindparam("r_ended_at"), outcome=bindparam("r_outcome"), reason=bindparam("r_reason"))
)


def latest_run(job_id: ColumnElement[str]) -> ScalarSelect[int]:
    """The id of the job's newest run: while the job runs, the run it is in (every claim
    starts a run in its own transaction, and ids only grow)."""
    return select(func.max(_RUNS.c.id)).where(_RUNS.c.job_id == job_id).scalar_subquery()


def record_run_start(
    session: Session,
    *,
    job_id: str,
    attempt: int,
    worker: str,
    host: str | None,
    device: str | None,
    started_at: datetime,
) -> int:
    """A run of ``job_id`` on ``worker`` begins; committed with the claim that made it.
    Returns its id, which fences the run's outcome (``jobs.record_outcomes``)."""
    return session.execute(
        _RUN_START,
        {
            "r_job_id": job_id,
            "r_attempt": attempt,
            "r_worker": worker,
            "r_host": host,
            "r_device": device,
            "r_started_at": started_at,
        },
    ).scalar_one()


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
        _RUN_END,
        {
            "r_job_id": job_id,
            "r_worker": worker,
            "r_ended_at": ended_at or utcnow(),
            "r_outcome": outcome.value,
            "r_reason": reason,
            "r_refunded": refunded,
        },
    )


def end_run(session: Session, run_id: int, *, outcome: RunOutcome, reason: str | None, ended_at: datetime) -> None:
    """Run ``run_id`` ends with its outcome; committed with the outcome's write."""
    session.execute(
        _RUN_END_BY_ID, {"r_id": run_id, "r_ended_at": ended_at, "r_outcome": outcome.value, "r_reason": reason}
    )


def runs_of_job(session: Session, job_id: str) -> Sequence[JobRun]:
    """Every run of the job, oldest first."""
    return session.scalars(select(JobRun).where(JobRun.job_id == job_id).order_by(JobRun.id)).all()
