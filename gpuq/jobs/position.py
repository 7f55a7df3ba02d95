"""Queues now: depth by model, kind and priority, and a queued job's place and ETA, in jobs
and in tokens.

Redis is the work index, so depths and positions are read from the RQ lists themselves
and the fair pick's state (``gpuq.jobs.fair``), and SQL supplies the rest: when the front
job was submitted, the tokens of the jobs ahead (their rows), and how fast the model has
been getting through tokens lately (``gpuq.stats.throughput``), which the ETA divides them
by. Each question is a Redis half and a SQL half; the ``*_async`` forms run the Redis half in
a worker thread (``anyio.to_thread``) and the SQL half in ``AsyncSession.run_sync``, so
neither blocks the event loop. ``gpuq.jobs.admission`` asks the same of a job about to be
queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from anyio import to_thread
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Job, JobStatus, utcnow
from gpuq.jobs import fair
from gpuq.jobs.aging import gpuq_queues
from gpuq.queue_names import Priority, band_name, parse_queue, queue_name, tenant_queue, tenant_segment
from gpuq.redis_keys import rq_job_key, rq_queue_key
from gpuq.stats import throughput
from gpuq.stats.filters import StatsFilter
from gpuq.stats.throughput import Throughput

ETA_RATE_WINDOW = throughput.WINDOW


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
class Ahead:
    """The jobs that go before one job of a band (queued, or about to be): the Redis half of a
    position. Each tenant queue ahead is read up to ``SAMPLE_PER_QUEUE`` jobs from its front;
    the rest of its jobs ahead count at the mean of those read."""

    in_band: int  # of its own priority, every tenant's, that the fair pick takes first
    higher: int  # in the higher priorities of its model and kind
    queues: list[tuple[list[str], int]]  # per tenant queue ahead: the first jobs read, and how many go first


SAMPLE_PER_QUEUE = 1000  # jobs read from the front of each queue ahead; the rest count at their mean


def jobs_ahead(
    redis: Redis, model: str, kind: str, priority: Priority, tenant: str, index: int, *, own_waiting: int | None = None
) -> Ahead:
    """The jobs ahead of the one at ``index`` in ``tenant``'s queue of the band (``tenant``: its
    segment; the job need not be queued yet): every job of the higher priorities, and those of
    its band that the fair pick takes first. ``own_waiting``: how many of its own queue's first
    jobs are there now, when fewer than ``index`` (the rest are jobs about to be queued with it)."""
    levels = [p for p in Priority if p <= priority]  # high first
    bands = [band_name(model, kind, p) for p in levels]
    states = [fair.band_state(redis, band_name(model, kind, p), tenant=tenant if p == priority else "") for p in levels]
    counted = [
        (tenant_queue(band, t), flow.length)
        for band, state in zip(bands[:-1], states[:-1], strict=True)
        for t, flow in state.flows.items()
    ]
    in_band = states[-1].ahead_by_tenant(tenant, index)
    own = min(index, index if own_waiting is None else own_waiting)
    counted += [(tenant_queue(bands[-1], t), own if t == tenant else n) for t, n in in_band.items()]
    queues = [(fair.first_in_queue(redis, q, min(n, SAMPLE_PER_QUEUE)), n) for q, n in counted if n > 0]
    return Ahead(sum(in_band.values()), sum(s.depth for s in states[:-1]), queues)


@dataclass(frozen=True, slots=True)
class Work:
    """Tokens, as positions and ETAs count them: a prompt's as counted at submission (or the
    model's recent mean where it was not counted), a completion's as its budget times the part
    of budgets the model's recent jobs used (``gpuq.stats.throughput``)."""

    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0

    @property
    def tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Work) -> Work:
        return Work(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


def work_ahead(session: Session, ahead: Ahead, pace: Throughput) -> Work:
    """The SQL half: the tokens of the jobs ahead, from their rows."""
    found = store.work_of_jobs(session, [job_id for first, _n in ahead.queues for job_id in first])
    total = Work()
    for first, n in ahead.queues:
        known = [pace.expected_tokens(*found[job_id]) for job_id in first if job_id in found]
        if not known:
            continue
        scale = n / len(known)  # 1 when every job ahead in this queue was read
        total += Work(sum(p for p, _c in known) * scale, sum(c for _p, c in known) * scale)
    return total


def eta_s(work: Work, jobs: int, pace: Throughput, per_min: float) -> float | None:
    """Seconds until that work is done: at the model's recent tokens per second, or, for work
    without tokens (noop jobs), its finished jobs per minute; None when nothing finished lately."""
    rate = pace.tokens_per_s
    if rate:
        return work.tokens / rate
    if per_min:
        return jobs / per_min * 60
    return None


@dataclass(frozen=True, slots=True)
class Position:
    job_id: str
    status: str
    queue: str | None  # the RQ queue it waits in (aging may have moved it up a priority)
    position: int | None  # jobs that run before it: 0 means it is next
    ahead_in_queue: int | None  # of its own priority (every tenant's), taken before it by fair shares
    ahead_in_higher_priorities: int | None
    prompt_tokens_ahead: int | None  # of the jobs ahead (``Work``)
    completion_tokens_ahead: int | None  # expected of the jobs ahead (``Work``)
    tokens_per_s: float | None  # of this model and kind lately (``gpuq.stats.throughput``)
    finished_per_min: float | None  # of this model and kind, over the last ETA_RATE_WINDOW
    eta_s: float | None  # until it starts: the tokens ahead at that rate; None when nothing finished lately
    deadline: datetime | None


def job_position(session: Session, redis: Redis, job: Job, *, now: datetime | None = None) -> Position:
    """Where a queued job stands: workers of its model and kind take higher priorities first,
    and within one the tenants' queues by fair shares (each tenant's own jobs with a deadline
    first, earliest first), so the jobs ahead are every job in the higher-priority queues of the
    same model and kind, plus those of its own band that the fair pick takes before it (its own
    tenant's in front of it, and each other tenant's up to the same virtual time), and the ETA
    is their tokens at the model's recent pace. Later arrivals may still take a turn before it:
    other tenants', and its own tenant's with an earlier deadline."""
    if job.status != JobStatus.QUEUED:
        return _not_queued(job)
    found = _find(redis, job.id, job.model, job.kind, job.owner)
    if found is None:
        return _not_queued(job)
    queue, ahead = found
    return _position(job, queue, ahead, _sql_half(session, ahead, job.model, job.kind, now or utcnow()))


async def job_position_async(db: AsyncSession, redis: Redis, job: Job, *, now: datetime | None = None) -> Position:
    if job.status != JobStatus.QUEUED:
        return _not_queued(job)
    job_id, model, kind, owner = job.id, job.model, job.kind, job.owner
    found = await to_thread.run_sync(lambda: _find(redis, job_id, model, kind, owner))
    if found is None:
        return _not_queued(job)
    at = now or utcnow()
    queue, ahead = found
    return _position(job, queue, ahead, await db.run_sync(lambda s: _sql_half(s, ahead, model, kind, at)))


def pace_of(session: Session, model: str, kind: str, now: datetime) -> tuple[Throughput, float]:
    """The model's recent pace on this kind: in tokens (``gpuq.stats.throughput``), and in
    finished jobs per minute over ``ETA_RATE_WINDOW``."""
    recent = store.count_finished_since(session, model, kind, now - ETA_RATE_WINDOW)
    return throughput.measure(session, model, kind, now), recent / (ETA_RATE_WINDOW.total_seconds() / 60)


def _sql_half(session: Session, ahead: Ahead, model: str, kind: str, now: datetime) -> tuple[Work, Throughput, float]:
    pace, per_min = pace_of(session, model, kind, now)
    return work_ahead(session, ahead, pace), pace, per_min


def _find(redis: Redis, job_id: str, model: str, kind: str, owner: str | None) -> tuple[str, Ahead] | None:
    """(queue, the jobs ahead), or None when it is in no queue. Looked for in its tenant's
    queues, and in the bands' own (where it waits if it was queued before tenants had queues
    of their own)."""
    places = [
        (p, name, tenant)
        for p in Priority  # high first
        for name, tenant in (
            (queue_name(model, kind, p, owner), tenant_segment(owner)),
            (band_name(model, kind, p), ""),
        )
    ]
    # In a worker's lane (gpuq.jobs.prefix_routing) its place counts as that in its tenant's
    # shared queue: a lane's jobs go at their tenant's fair turns, as the shared queue's do.
    origin = cast(bytes | None, redis.hget(rq_job_key(job_id), "origin"))
    if origin is not None:
        try:
            parsed = parse_queue(origin.decode())
        except ValueError:
            parsed = None
        if parsed is not None and parsed.lane and (parsed.model, parsed.kind) == (model, kind):
            places.insert(0, (parsed.priority, origin.decode(), parsed.tenant))
    with redis.pipeline(transaction=False) as pipe:
        for _p, name, _t in places:
            pipe.lpos(rq_queue_key(name), job_id)
        raw: list[Any] = pipe.execute()
    found = next((i for i in range(len(places)) if raw[i] is not None), None)
    if found is None:
        return None
    priority, name, tenant = places[found]
    return name, jobs_ahead(redis, model, kind, priority, tenant, int(raw[found]))


def _not_queued(job: Job) -> Position:
    # Not queued, or queued in SQL but not (yet, or any more) in Redis: the reconciler will enqueue it.
    return Position(job.id, job.status, None, None, None, None, None, None, None, None, None, job.deadline)


def _position(job: Job, queue: str, ahead: Ahead, sql_half: tuple[Work, Throughput, float]) -> Position:
    work, pace, per_min = sql_half
    eta = eta_s(work, ahead.in_band + ahead.higher, pace, per_min)
    rate = pace.tokens_per_s
    return Position(
        job.id,
        job.status,
        queue,
        ahead.in_band + ahead.higher,
        ahead.in_band,
        ahead.higher,
        round(work.prompt_tokens),
        round(work.completion_tokens),
        None if rate is None else round(rate, 1),
        round(per_min, 2),
        None if eta is None else round(eta, 1),
        job.deadline,
    )
