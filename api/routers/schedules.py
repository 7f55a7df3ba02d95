"""/v1/schedules: cron schedules of batch runs; pause, resume, run now, preview, history."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Response, status

from api.deps import ADMIN_ONLY, AdminDep, RowId, SessionDep, StateDep
from api.errors import errors
from api.schemas import (
    FireTimes,
    ScheduleCreate,
    SchedulePatch,
    SchedulePublic,
    ScheduleRunPublic,
    ScheduleRunsPublic,
    SchedulesPublic,
)
from gpuq import store
from gpuq.batches import schedules
from gpuq.batches import service as batches
from gpuq.batches.queue_order import Planning
from gpuq.db.tables import Schedule, utcnow
from gpuq.errors import RequestError

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], dependencies=ADMIN_ONLY, responses=errors(403))


async def _get(db: SessionDep, schedule_id: int) -> Schedule:
    found = await db.run_sync(store.get_schedule, schedule_id)
    if found is None:
        raise RequestError(404, f"schedule {schedule_id} does not exist")
    return found


@router.get("", response_model=SchedulesPublic)
async def list_schedules(db: SessionDep) -> SchedulesPublic:
    return SchedulesPublic(data=[SchedulePublic.of(s) for s in await db.run_sync(store.list_schedules)])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SchedulePublic, responses=errors(409))
async def create_schedule(body: ScheduleCreate, db: SessionDep, state: StateDep, caller: AdminDep) -> SchedulePublic:
    """The cron, time zone, completion window and batch are checked now (a dry run of the
    batch's lines), so a schedule that could never run is a 422 today, not a failed run
    tonight. Whether the fleet can finish a run in its window is judged when it fires."""
    schedules.zone(body.timezone)
    next_fire_at = schedules.first_fire_time(body.cron, body.timezone)
    batches.completion_window_s(body.completion_window)
    if any(s.name == body.name for s in await db.run_sync(store.list_schedules)):
        raise RequestError(409, f"a schedule named {body.name!r} exists already")

    def prepare() -> str:
        with state.sync_sessions() as session:
            if body.requests is None:
                file = store.get_file(session, body.input_file_id or "")
                if file is None:
                    raise RequestError(422, f"input file {body.input_file_id!r} does not exist")
                batches.check_input_file(file)
                batches.plan_batch_jobs(session, path=file.path, batch_id="dry-run", priority=body.priority)
                return file.id
            file = schedules.store_inline_requests(body.requests, state.settings.data_dir)
            try:
                batches.plan_batch_jobs(session, path=file.path, batch_id="dry-run", priority=body.priority)
            except RequestError:
                Path(file.path).unlink()  # nothing half-created
                raise
            return store.save_file(session, file).id

    file_id = await to_thread.run_sync(prepare)
    schedule = Schedule(
        name=body.name,
        cron=body.cron,
        timezone=body.timezone,
        input_file_id=file_id,
        requests=body.requests,
        endpoint=body.endpoint,
        priority=body.priority,
        enabled=body.enabled,
        misfire=body.misfire,
        completion_window=body.completion_window,
        next_fire_at=next_fire_at,
        owner=body.owner or caller.owner,
        created_at=utcnow(),
    )
    return SchedulePublic.of(await db.run_sync(lambda s: store.save_schedule(s, schedule)))


@router.get("/{schedule_id}", response_model=SchedulePublic, responses=errors(404))
async def read_schedule(schedule_id: RowId, db: SessionDep) -> SchedulePublic:
    return SchedulePublic.of(await _get(db, schedule_id))


@router.patch("/{schedule_id}", response_model=SchedulePublic, responses=errors(404))
async def update_schedule(schedule_id: RowId, body: SchedulePatch, db: SessionDep) -> SchedulePublic:
    """Change the cron, time zone, misfire policy, priority or completion window (for the runs
    to come); pause or resume with `enabled`."""
    schedule = await _get(db, schedule_id)
    cron, tz = body.cron or schedule.cron, body.timezone or schedule.timezone
    schedules.zone(tz)
    next_fire_at = schedules.first_fire_time(cron, tz)
    if body.completion_window is not None:
        batches.completion_window_s(body.completion_window)
        schedule.completion_window = body.completion_window
    resumed = body.enabled is True and not schedule.enabled
    schedule.cron, schedule.timezone = cron, tz
    if body.misfire is not None:
        schedule.misfire = body.misfire
    if body.priority is not None:
        schedule.priority = body.priority
    if body.enabled is not None:
        schedule.enabled = body.enabled
    if body.cron or body.timezone or resumed:  # a resumed schedule does not fire for its pause
        schedule.next_fire_at = next_fire_at
    return SchedulePublic.of(await db.run_sync(lambda s: store.save_schedule(s, schedule)))


@router.post("/{schedule_id}/pause", response_model=SchedulePublic, responses=errors(404))
async def pause_schedule(schedule_id: RowId, db: SessionDep) -> SchedulePublic:
    return await update_schedule(schedule_id, SchedulePatch(enabled=False), db)


@router.post("/{schedule_id}/resume", response_model=SchedulePublic, responses=errors(404))
async def resume_schedule(schedule_id: RowId, db: SessionDep) -> SchedulePublic:
    return await update_schedule(schedule_id, SchedulePatch(enabled=True), db)


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
async def delete_schedule(schedule_id: RowId, db: SessionDep) -> Response:
    if not await db.run_sync(store.delete_schedule, schedule_id):
        raise RequestError(404, f"schedule {schedule_id} does not exist")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{schedule_id}/run", response_model=ScheduleRunPublic, responses=errors(404))
async def run_schedule_now(schedule_id: RowId, db: SessionDep, state: StateDep) -> ScheduleRunPublic:
    """Start the schedule's batch now, whatever its cron says (recorded as a manual run)."""
    await _get(db, schedule_id)

    def run() -> ScheduleRunPublic:
        with state.sync_sessions() as session:
            schedule = store.get_schedule(session, schedule_id)
            assert schedule is not None
            fired = schedules.run_now(
                session,
                state.redis,
                schedule,
                timeout_s=state.settings.job_timeout_s,
                worker_slots=state.settings.worker_slots,
                planning=Planning.of(state.settings),
            )
            return ScheduleRunPublic.of(fired, "in_progress" if fired.batch_id else None)

    return await to_thread.run_sync(run)


@router.get("/{schedule_id}/preview", response_model=FireTimes, responses=errors(404))
async def preview_fire_times(
    schedule_id: RowId, db: SessionDep, n: Annotated[int, Query(ge=1, le=100)] = 5
) -> FireTimes:
    schedule = await _get(db, schedule_id)
    times = schedules.fire_times(schedule.cron, schedule.timezone, utcnow(), n)
    return FireTimes(cron=schedule.cron, timezone=schedule.timezone, next=times)


@router.get("/{schedule_id}/runs", response_model=ScheduleRunsPublic, responses=errors(404))
async def schedule_history(
    schedule_id: RowId, db: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> ScheduleRunsPublic:
    await _get(db, schedule_id)
    rows = await db.run_sync(lambda s: store.schedule_runs(s, schedule_id, limit=limit))
    return ScheduleRunsPublic(data=[ScheduleRunPublic.of(run, batch_status) for run, batch_status in rows])
