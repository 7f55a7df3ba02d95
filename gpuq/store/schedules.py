"""Cron schedules and their runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    Batch,
    Schedule,
    ScheduleRun,
)

# ---------------------------------------------------------------- schedules


def list_schedules(session: Session) -> Sequence[Schedule]:
    return session.scalars(select(Schedule).order_by(Schedule.name)).all()


def get_schedule(session: Session, schedule_id: int) -> Schedule | None:
    return session.get(Schedule, schedule_id)


def save_schedule(session: Session, schedule: Schedule) -> Schedule:
    merged = session.merge(schedule)
    session.commit()
    return merged


def delete_schedule(session: Session, schedule_id: int) -> bool:
    deleted = session.execute(delete(Schedule).where(Schedule.id == schedule_id)).rowcount
    session.commit()
    return bool(deleted)


def schedule_runs(session: Session, schedule_id: int, *, limit: int) -> list[tuple[ScheduleRun, str | None]]:
    """Recent runs, newest first, with the status of the batch each started."""
    rows = session.execute(
        select(ScheduleRun, Batch.status)
        .outerjoin(Batch, Batch.id == ScheduleRun.batch_id)
        .where(ScheduleRun.schedule_id == schedule_id)
        .order_by(ScheduleRun.fire_time.desc())
        .limit(limit)
    )
    return [(run, status) for run, status in rows]
