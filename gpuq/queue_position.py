"""Queues now: depth by model, kind and priority, and a queued job's place and ETA.

Redis is the work index, so depths and positions are read from the RQ lists themselves
(one pipeline), and SQL only supplies the times: when the front job was submitted, and
how fast the model has been finishing jobs lately.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from redis import Redis
from rq import Queue
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuq.aging import gpuq_queues
from gpuq.models import Job, JobStatus, utcnow
from gpuq.queues import Priority, queue_name
from gpuq.stats_filters import StatsFilter

ETA_RATE_WINDOW = timedelta(minutes=15)  # recent enough to follow load, long enough to smooth it


def _key(name: str) -> str:
    return Queue.redis_queue_namespace_prefix + name


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
    now = now or utcnow()
    queues = [
        q
        for q in gpuq_queues(redis)
        if (flt.model is None or q[1] == flt.model)
        and (flt.kind is None or q[2] == flt.kind)
        and (flt.priority is None or q[3] == flt.priority)
    ]
    with redis.pipeline(transaction=False) as pipe:
        for name, *_ in queues:
            pipe.llen(_key(name))
            pipe.lindex(_key(name), 0)
        raw = pipe.execute()
    fronts = {raw[2 * i + 1].decode(): q for i, q in enumerate(queues) if raw[2 * i]}
    created = {
        row.id: row.created_at
        for row in session.execute(select(Job.id, Job.created_at).where(Job.id.in_(list(fronts))))
    }
    out = []
    for i, (_name, model, kind, priority) in enumerate(queues):
        depth, front = raw[2 * i], raw[2 * i + 1]
        if not depth:
            continue
        front_id = front.decode() if front else None
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
    ahead_in_queue: int | None
    ahead_in_higher_priorities: int | None
    finished_per_min: float | None  # of this model and kind, over the last ETA_RATE_WINDOW
    eta_s: float | None  # until it starts, at that rate; None when nothing finished lately


def job_position(session: Session, redis: Redis, job: Job, *, now: datetime | None = None) -> Position:
    """Where a queued job stands: workers of its model and kind take higher priorities first,
    first in first out within one, so the jobs ahead are those in front of it in its own queue
    plus every job in the higher-priority queues of the same model and kind."""
    if job.status != JobStatus.QUEUED:
        return Position(job.id, job.status, None, None, None, None, None, None)
    names = [queue_name(job.model, job.kind, p) for p in Priority]  # high first
    with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.lpos(_key(name), job.id)
            pipe.llen(_key(name))
        raw = pipe.execute()
    found = next((i for i in range(len(names)) if raw[2 * i] is not None), None)
    if found is None:
        # Queued in SQL but not (yet, or any more) in Redis: the reconciler will enqueue it.
        return Position(job.id, job.status, None, None, None, None, None, None)
    in_queue = int(raw[2 * found])
    higher = sum(int(raw[2 * i + 1]) for i in range(found))
    ahead = in_queue + higher
    now = now or utcnow()
    recent = session.scalar(
        select(func.count()).where(
            Job.model == job.model,
            Job.kind == job.kind,
            Job.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED)),
            Job.finished_at >= now - ETA_RATE_WINDOW,
        )
    )
    per_min = (recent or 0) / (ETA_RATE_WINDOW.total_seconds() / 60)
    eta = round(ahead / per_min * 60, 1) if per_min else None
    return Position(job.id, job.status, names[found], ahead, in_queue, higher, round(per_min, 2), eta)
