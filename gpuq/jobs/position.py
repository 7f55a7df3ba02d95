"""Queues now: depth by model, kind and priority, and a queued job's place and ETA.

Redis is the work index, so depths and positions are read from the RQ lists themselves
and the fair pick's state (``gpuq.jobs.fair``), and SQL only supplies the times: when the
front job was submitted, and how fast the model has been finishing jobs lately. Each question is a Redis half and a SQL
half; the ``*_async`` forms run the Redis half in a worker thread (``anyio.to_thread``)
and the SQL half in ``AsyncSession.run_sync``, so neither blocks the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from anyio import to_thread
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Job, JobStatus, utcnow
from gpuq.jobs import fair
from gpuq.jobs.aging import gpuq_queues
from gpuq.queue_names import Priority, band_name, queue_name, tenant_segment
from gpuq.redis_keys import rq_queue_key
from gpuq.stats.filters import StatsFilter

ETA_RATE_WINDOW = timedelta(minutes=15)  # recent enough to follow load, long enough to smooth it


@dataclass(frozen=True, slots=True)
class QueueDepth:
    model: str
    kind: str
    priority: str
    depth: int
    front_job_id: str | None
    front_waiting_s: float | None  # how long the job at the front has waited since it was submitted


def queue_depths(session: Session, redis: Redis, flt: StatsFilter, *, now: datetime | None = None) -> list[QueueDepth]:
    """Every gpuq queue with jobs waiting, highest priority first, then by model and kind."""
    listed = _read_queues(redis, flt)
    return _depths(listed, _created(session, listed), now or utcnow())


async def queue_depths_async(
    db: AsyncSession, redis: Redis, flt: StatsFilter, *, now: datetime | None = None
) -> list[QueueDepth]:
    listed = await to_thread.run_sync(lambda: _read_queues(redis, flt))
    created = await db.run_sync(lambda s: _created(s, listed))
    return _depths(listed, created, now or utcnow())


Listed = list[tuple[tuple[str, str, str, Priority], int, str | None]]  # band, depth, front job id


def _read_queues(redis: Redis, flt: StatsFilter) -> Listed:
    """Each band with jobs waiting, its depth summed over its tenants' queues, and the job its
    fair pick gives out next."""
    queues = [
        (name, q)
        for name, q in gpuq_queues(redis)
        if (flt.model is None or q.model == flt.model)
        and (flt.kind is None or q.kind == flt.kind)
        and (flt.priority is None or q.priority == flt.priority)
    ]
    with redis.pipeline(transaction=False) as pipe:
        for name, _q in queues:
            pipe.llen(rq_queue_key(name))
        lengths = pipe.execute()
    depth: dict[tuple[str, str, str, Priority], int] = {}
    for (_name, q), length in zip(queues, lengths, strict=True):
        band = (q.band, q.model, q.kind, q.priority)
        depth[band] = depth.get(band, 0) + int(length)
    listed: Listed = []
    for band, n in depth.items():
        if n:
            front = fair.Picker(redis, [band[0]]).peek()
            listed.append((band, n, front[1] if front else None))
    return listed


def _created(session: Session, listed: Listed) -> dict[str, datetime]:
    return store.creation_times(session, [front for _q, _depth, front in listed if front])


def _depths(listed: Listed, created: dict[str, datetime], now: datetime) -> list[QueueDepth]:
    out = []
    for (_name, model, kind, priority), depth, front_id in listed:
        since = created.get(front_id) if front_id else None
        waiting = round((now - since).total_seconds(), 1) if since else None
        out.append(QueueDepth(model, kind, priority.label, depth, front_id, waiting))
    return sorted(out, key=lambda q: (Priority.parse(q.priority).value, q.model, q.kind))


@dataclass(frozen=True, slots=True)
class Position:
    job_id: str
    status: str
    queue: str | None  # the RQ queue it waits in (aging may have moved it up a priority)
    position: int | None  # jobs that run before it: 0 means it is next
    ahead_in_queue: int | None  # of its own priority (every tenant's), taken before it by fair shares
    ahead_in_higher_priorities: int | None
    finished_per_min: float | None  # of this model and kind, over the last ETA_RATE_WINDOW
    eta_s: float | None  # until it starts, at that rate; None when nothing finished lately


def job_position(session: Session, redis: Redis, job: Job, *, now: datetime | None = None) -> Position:
    """Where a queued job stands: workers of its model and kind take higher priorities first,
    and within one the tenants' queues by fair shares, so the jobs ahead are every job in the
    higher-priority queues of the same model and kind, plus those of its own band that the
    fair pick takes before it (its own tenant's in front of it, and each other tenant's up to
    the same virtual time). Later arrivals of other tenants may still take a turn before it."""
    if job.status != JobStatus.QUEUED:
        return _position(job, None, None)
    place = _find(redis, job.id, job.model, job.kind, job.owner)
    now = now or utcnow()
    return _position(job, place, _per_min(session, job.model, job.kind, now) if place else None)


async def job_position_async(db: AsyncSession, redis: Redis, job: Job, *, now: datetime | None = None) -> Position:
    if job.status != JobStatus.QUEUED:
        return _position(job, None, None)
    job_id, model, kind, owner = job.id, job.model, job.kind, job.owner
    place = await to_thread.run_sync(lambda: _find(redis, job_id, model, kind, owner))
    at = now or utcnow()
    per_min = await db.run_sync(lambda s: _per_min(s, model, kind, at)) if place else None
    return _position(job, place, per_min)


def _find(redis: Redis, job_id: str, model: str, kind: str, owner: str | None) -> tuple[str, int, int] | None:
    """(queue, jobs of its band taken before it, jobs in higher priorities), or None when it
    is in no queue. Looked for in its tenant's queues, and in the bands' own (where it waits
    if it was queued before tenants had queues of their own)."""
    places = [
        (p, name, tenant)
        for p in Priority  # high first
        for name, tenant in (
            (queue_name(model, kind, p, owner), tenant_segment(owner)),
            (band_name(model, kind, p), ""),
        )
    ]
    with redis.pipeline(transaction=False) as pipe:
        for _p, name, _t in places:
            pipe.lpos(rq_queue_key(name), job_id)
        raw: list[Any] = pipe.execute()
    found = next((i for i in range(len(places)) if raw[i] is not None), None)
    if found is None:
        return None
    priority, name, tenant = places[found]
    bands = [fair.band_state(redis, band_name(model, kind, p)) for p in Priority if p <= priority]
    return name, bands[-1].jobs_ahead(tenant, int(raw[found])), sum(b.depth for b in bands[:-1])


def _per_min(session: Session, model: str, kind: str, now: datetime) -> float:
    recent = store.count_finished_since(session, model, kind, now - ETA_RATE_WINDOW)
    return recent / (ETA_RATE_WINDOW.total_seconds() / 60)


def _position(job: Job, place: tuple[str, int, int] | None, per_min: float | None) -> Position:
    if place is None or per_min is None:
        # Not queued, or queued in SQL but not (yet, or any more) in Redis: the reconciler will enqueue it.
        return Position(job.id, job.status, None, None, None, None, None, None)
    queue, in_queue, higher = place
    ahead = in_queue + higher
    eta = round(ahead / per_min * 60, 1) if per_min else None
    return Position(job.id, job.status, queue, ahead, in_queue, higher, round(per_min, 2), eta)
