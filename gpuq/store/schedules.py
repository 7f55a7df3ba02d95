"""Cron schedules and their runs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    Batch,
    Schedule,
    ScheduleRun,
    utcnow,
)
from gpuq.store._sql import commit_changed

# ---------------------------------------------------------------- schedules


def list_schedules(session: Session) -> Sequence[Schedule]:
    return session.scalars(select(Schedule).order_by(Schedule.name)).all()


def schedules_reading_file(session: Session, file_id: str) -> list[Schedule]:
    """The schedules whose runs start batches from this stored file."""
    return list(session.scalars(select(Schedule).where(Schedule.input_file_id == file_id).order_by(Schedule.id)))


def get_schedule(session: Session, schedule_id: int) -> Schedule | None:
    return session.get(Schedule, schedule_id)


def save_schedule(session: Session, schedule: Schedule) -> Schedule:
    merged = session.merge(schedule)
    session.commit()
    return merged


def delete_schedule(session: Session, schedule_id: int) -> bool:
    return commit_changed(session, delete(Schedule).where(Schedule.id == schedule_id))


def due_schedules(session: Session, now: datetime) -> list[Schedule]:
    """Enabled schedules whose next fire time has come."""
    return list(session.scalars(select(Schedule).where(Schedule.enabled.is_(True), Schedule.next_fire_at <= now)))


def set_next_fire_time(session: Session, schedule: Schedule, when: datetime) -> None:
    schedule.next_fire_at = when
    session.commit()


# ---------------------------------------------------------------- runs


def claim_schedule_run(session: Session, run: ScheduleRun) -> bool:
    """Insert the run of one tick; False when another scheduler has inserted that tick's
    run first (a run is unique per schedule and fire time): that scheduler fires it."""
    session.add(run)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return False
    return True


def record_schedule_fired(
    session: Session, schedule: Schedule, run: ScheduleRun, *, batch_id: str | None, error: str | None
) -> None:
    """The batch a claimed run started, or why it could not, and when the schedule last fired."""
    run.batch_id = batch_id
    run.error = error
    schedule.last_fired_at = utcnow()
    session.commit()


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


def schedule_run_of_batch(session: Session, batch_id: str) -> tuple[ScheduleRun, str] | None:
    """The run of a schedule that started this batch, with the schedule's name; None for a
    batch someone created (or whose schedule was deleted)."""
    row = session.execute(
        select(ScheduleRun, Schedule.name)
        .join(Schedule, Schedule.id == ScheduleRun.schedule_id)
        .where(ScheduleRun.batch_id == batch_id)
        .limit(1)
    ).first()
    return (row[0], row[1]) if row is not None else None
