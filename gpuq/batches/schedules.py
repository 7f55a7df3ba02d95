"""Cron schedules that fire batch runs, exactly once per tick however many schedulers run.

Exactly once is the database's doing, not luck: a run is a row unique per (schedule,
fire time), inserted before the batch is started; a second scheduler that reaches the
same tick fails that insert and moves on. RQ's own cron runner has neither this nor
catch-up (rq/rq#2338).

Misfires: a tick found more than ``MISFIRE_GRACE_S`` late (no scheduler ran at the time)
is dropped under ``skip``, or caught up by a single run under ``run_once``; several
missed ticks never cause several runs.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from redis import Redis
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches import service as batches
from gpuq.batches.files import PURPOSE_BATCH, LineScanner, files_dir, jsonl_line, new_file_id
from gpuq.batches.queue_order import Planning
from gpuq.db.tables import File, MisfirePolicy, Schedule, ScheduleRun, utcnow
from gpuq.errors import RequestError
from gpuq.private_files import write_private

log = logging.getLogger(__name__)

MISFIRE_GRACE_S = 60.0
MAX_CATCH_UP_TICKS = 10_000  # bound the walk over missed ticks (a per-minute cron down for days)
CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise RequestError(422, f"unknown time zone {name!r}; use an IANA name such as UTC or Europe/Paris") from None


def check_cron(expression: str, tz: str = "UTC") -> datetime:
    """The first fire time of a valid cron expression (after now, in UTC), or a 422 saying
    what is wrong. croniter also reads a sixth field (seconds) and a seventh (years); gpuq
    takes the standard five fields, or an alias such as @daily, and refuses expressions that
    match no date at all (``0 0 31 2 *``), which croniter only finds out when asked for one."""
    fields = expression.split()
    if not (len(fields) == 5 or (len(fields) == 1 and fields[0].lower() in CRON_ALIASES)):
        raise RequestError(
            422,
            f"invalid cron expression {expression!r}: give five fields (minute hour day-of-month month "
            f"day-of-week, e.g. '0 2 * * *') or one of {', '.join(sorted(CRON_ALIASES))}; "
            f"gpuq has no seconds or years field",
            param="cron",
        )
    try:
        return next_fire_time(expression, tz, utcnow())
    except CroniterBadDateError:
        raise RequestError(
            422, f"cron expression {expression!r} never fires: no date matches it (such as 31 February)", param="cron"
        ) from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise RequestError(422, f"invalid cron expression {expression!r}: {exc}", param="cron") from None


def fire_times(expression: str, tz: str, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` fire times strictly after ``after``, in UTC."""
    it = croniter(expression, after.astimezone(zone(tz)))
    return [it.get_next(datetime).astimezone(ZoneInfo("UTC")) for _ in range(count)]


def next_fire_time(expression: str, tz: str, after: datetime) -> datetime:
    return fire_times(expression, tz, after, 1)[0]


def _latest_due(schedule: Schedule, now: datetime) -> datetime:
    """The latest tick at or before ``now`` (schedule.next_fire_at is the first due one)."""
    latest = schedule.next_fire_at
    it = croniter(schedule.cron, latest.astimezone(zone(schedule.timezone)))
    for _ in range(MAX_CATCH_UP_TICKS):
        following = it.get_next(datetime).astimezone(ZoneInfo("UTC"))
        if following > now:
            break
        latest = following
    return latest


def store_inline_requests(lines: list[dict[str, Any]], data_dir: Path) -> File:
    """Inline requests become a stored batch file once, at schedule creation, checked as uploads are."""
    scanner = LineScanner()
    payload = b"".join(jsonl_line(line) for line in lines)
    scanner.feed(payload)
    scanner.finish()
    if scanner.errors:
        raise RequestError(
            422, "invalid requests: " + "; ".join(e.replace("line", "request", 1) for e in scanner.errors[:20])
        )
    if scanner.lines == 0:
        raise RequestError(422, "`requests` is empty")
    file_id = new_file_id()
    path = files_dir(data_dir) / f"{file_id}.jsonl"
    write_private(path, payload)
    return File(
        id=file_id,
        purpose=PURPOSE_BATCH,
        filename=f"{file_id}.jsonl",
        bytes=len(payload),
        line_count=scanner.lines,
        path=str(path),
        created_at=utcnow(),
    )


def fire(
    session: Session,
    redis: Redis,
    schedule: Schedule,
    fire_time: datetime,
    *,
    trigger: str,
    timeout_s: int,
    worker_slots: int = 0,
    planning: Planning | None = None,
) -> ScheduleRun | None:
    """Run the schedule's batch for one tick, unless another scheduler already has
    (``worker_slots``: ``GPUQ_WORKER_SLOTS``, gpuq/fleet/sample_limit.py). The batch has the
    schedule's completion window, from now: a catch-up run's lines are not due before it
    starts. A batch admission refuses (the fleet cannot finish it in its window) is, like any
    batch that cannot start, the run's recorded error."""
    run = ScheduleRun(schedule_id=schedule.id, fire_time=fire_time, trigger=trigger, created_at=utcnow())
    if not store.claim_schedule_run(session, run):
        return None
    batch_id: str | None = None
    error: str | None = None
    try:
        batch = batches.start_batch(
            session,
            redis,
            input_file_id=schedule.input_file_id or "",
            endpoint=schedule.endpoint,
            completion_window=schedule.completion_window,
            priority=schedule.priority,
            metadata={"schedule": schedule.name, "fire_time": fire_time.isoformat(), "trigger": trigger},
            timeout_s=timeout_s,
            owner=schedule.owner,
            worker_slots=worker_slots,
            planning=planning,
        )
        batch_id = batch.id
    except RequestError as exc:
        error = exc.message
        log.warning("schedule %s could not start its batch: %s", schedule.name, exc.message)
    store.record_schedule_fired(session, schedule, run, batch_id=batch_id, error=error)
    return run


def _paused_for_its_cron(session: Session, schedule: Schedule) -> bool:
    """A schedule stored before its cron was checked as it is now (a seconds field made one
    fire every second) is paused, and says so, instead of firing."""
    try:
        check_cron(schedule.cron, schedule.timezone)
    except RequestError as exc:
        log.warning("schedule %s is paused: %s", schedule.name, exc.message)
        schedule.enabled = False
        store.save_schedule(session, schedule)
        return True
    return False


def fire_due_schedules(
    session: Session,
    redis: Redis,
    *,
    now: datetime | None = None,
    timeout_s: int = 3600,
    worker_slots: int = 0,
    planning: Planning | None = None,
) -> list[ScheduleRun]:
    """The scheduler's tick: fire every schedule that is due, once, by its misfire policy."""
    now = now or utcnow()
    runs = []
    for schedule in store.due_schedules(session, now):
        if _paused_for_its_cron(session, schedule):
            continue
        latest = _latest_due(schedule, now)
        on_time = (now - latest).total_seconds() <= MISFIRE_GRACE_S
        if on_time or schedule.misfire == MisfirePolicy.RUN_ONCE:
            trigger = "cron" if on_time else "catch-up"
            run = fire(
                session,
                redis,
                schedule,
                latest,
                trigger=trigger,
                timeout_s=timeout_s,
                worker_slots=worker_slots,
                planning=planning,
            )
            if run is not None:
                runs.append(run)
        else:
            log.info("schedule %s missed its tick at %s (misfire policy: skip)", schedule.name, latest)
        store.set_next_fire_time(session, schedule, next_fire_time(schedule.cron, schedule.timezone, now))
    return runs


def run_now(
    session: Session,
    redis: Redis,
    schedule: Schedule,
    *,
    timeout_s: int,
    worker_slots: int = 0,
    planning: Planning | None = None,
) -> ScheduleRun:
    run = fire(
        session,
        redis,
        schedule,
        utcnow(),
        trigger="manual",
        timeout_s=timeout_s,
        worker_slots=worker_slots,
        planning=planning,
    )
    assert run is not None  # a manual run's fire time is now: unique
    return run


def first_fire_time(expression: str, tz: str) -> datetime:
    zone(tz)
    return check_cron(expression, tz)
