"""/v1/stats: the admin dashboard's JSON. Checks and queries live in gpuq (stats, stats_filters,
queue_position); this only maps query parameters in and dataclasses out."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from api.deps import ADMIN_ONLY, SessionDep, StateDep
from api.errors import errors
from api.schemas.common import PriorityName
from api.schemas.stats import (
    EnergyRow,
    FailureReasonPublic,
    GpuPointPublic,
    GpuStats,
    LatencyPercentiles,
    QueueDepthPublic,
    StatsEnergy,
    StatsFailures,
    StatsGpus,
    StatsQueues,
    StatsSummary,
    StatsTenants,
    StatsThroughput,
    StatsWindow,
    TenantSharePublic,
    ThroughputPointPublic,
    UsageSums,
)
from gpuq.fleet import telemetry
from gpuq.jobs.position import queue_depths_async
from gpuq.stats import queries as stats
from gpuq.stats.filters import StatsFilter, Window, parse_filter, parse_window
from gpuq.stats.queries import Sums
from gpuq.stats.tenants import tenant_shares

router = APIRouter(prefix="/v1/stats", tags=["stats"], dependencies=ADMIN_ONLY, responses=errors(403))


class StatsQuery:
    """The window and filters every stats route takes; checked in gpuq (422 with what to fix)."""

    def __init__(
        self,
        since: Annotated[datetime | None, Query(description="ISO 8601 with a time zone; default until - 1 h")] = None,
        until: Annotated[datetime | None, Query(description="ISO 8601 with a time zone; default now")] = None,
        model: str | None = None,
        gpu: Annotated[str | None, Query(description="GPU UUID")] = None,
        host: str | None = None,
        tenant: str | None = None,
        kind: str | None = None,
        priority: Annotated[PriorityName | None, Query(description="high, normal or low")] = None,
    ) -> None:
        self.since, self.until = since, until
        self.filters = {"model": model, "gpu": gpu, "host": host, "tenant": tenant, "kind": kind}
        self.priority = priority

    def parse(self, session: Session) -> tuple[Window, StatsFilter]:
        window = parse_window(self.since, self.until)
        return window, parse_filter(session, priority=self.priority, **self.filters)


QueryDep = Annotated[StatsQuery, Depends()]


def _window(w: Window) -> StatsWindow:
    return StatsWindow(since=w.since, until=w.until)


@router.get("/summary", response_model=StatsSummary)
async def summary(q: QueryDep, db: SessionDep) -> StatsSummary:
    """Jobs finished in the window by status, queued and running now, tokens, energy, and
    queue-wait and run-time p50/p95/p99."""

    def run(s: Session) -> StatsSummary:
        window, flt = q.parse(s)
        r = stats.summary(s, window, flt)
        return StatsSummary(
            window=_window(window),
            finished=r.finished,
            in_flight=r.in_flight,
            usage=UsageSums.of(r.sums, window),
            queue_wait=LatencyPercentiles.of(r.queue_wait),
            run_time=LatencyPercentiles.of(r.run_time),
        )

    return await db.run_sync(run)


@router.get("/throughput", response_model=StatsThroughput)
async def throughput(
    q: QueryDep,
    db: SessionDep,
    bucket: Annotated[str | None, Query(description="1m, 5m, 1h or 1d; default chosen from the window")] = None,
) -> StatsThroughput:
    """Jobs finished and tokens per bucket over the window, every bucket present."""

    def run(s: Session) -> StatsThroughput:
        window, flt = q.parse(s)
        size = stats.choose_bucket(window, bucket)
        minutes = size.total_seconds() / 60
        points = stats.throughput(s, window, flt, size)
        return StatsThroughput(
            window=_window(window),
            bucket_s=int(size.total_seconds()),
            data=[
                ThroughputPointPublic(
                    start=p.start,
                    succeeded=p.succeeded,
                    failed=p.failed,
                    cancelled=p.cancelled,
                    jobs_per_min=round((p.succeeded + p.failed + p.cancelled) / minutes, 3),
                    prompt_tokens=p.prompt_tokens,
                    completion_tokens=p.completion_tokens,
                    tokens_per_min=round((p.prompt_tokens + p.completion_tokens) / minutes, 3),
                )
                for p in points
            ],
        )

    return await db.run_sync(run)


@router.get("/failures", response_model=StatsFailures)
async def failures(q: QueryDep, db: SessionDep, top: Annotated[int, Query(ge=1, le=100)] = 10) -> StatsFailures:
    """Failed jobs in the window: the most frequent reasons, each with its newest example."""

    def run(s: Session) -> StatsFailures:
        window, flt = q.parse(s)
        total, reasons = stats.failures(s, window, flt, top=top)
        return StatsFailures(
            window=_window(window),
            failed=total,
            data=[
                FailureReasonPublic(reason=r.reason, jobs=r.jobs, latest_job_id=r.latest_job_id, latest_at=r.latest_at)
                for r in reasons
            ],
        )

    return await db.run_sync(run)


def _rows(sums: dict[tuple[object, ...], Sums], window: Window) -> list[EnergyRow]:
    return sorted(
        (EnergyRow(key=str(key[0]), **UsageSums.of(s, window).model_dump()) for key, s in sums.items()),
        key=lambda r: (-r.energy_j, -r.jobs, r.key),
    )


@router.get("/energy", response_model=StatsEnergy)
async def energy(q: QueryDep, db: SessionDep) -> StatsEnergy:
    """GPU-seconds and joules per model and per tenant, with how many jobs had a measured figure."""

    def run(s: Session) -> StatsEnergy:
        window, flt = q.parse(s)
        by_model = stats.grouped_sums(s, window, flt, ("model",))
        by_tenant = stats.grouped_sums(s, window, flt, ("owner",))
        total = Sums()
        for part in by_model.values():
            total.add(part)
        return StatsEnergy(
            window=_window(window),
            total=UsageSums.of(total, window),
            by_model=_rows(by_model, window),
            by_tenant=_rows(by_tenant, window),
        )

    return await db.run_sync(run)


@router.get("/gpus", response_model=StatsGpus)
async def gpus(
    q: QueryDep,
    db: SessionDep,
    state: StateDep,
    bucket: Annotated[str | None, Query(description="1m, 5m, 1h or 1d; default chosen from the window")] = None,
) -> StatsGpus:
    """Per GPU: utilisation, memory, power and temperature over the window (telemetry samples),
    jobs, tokens/s and energy (job history), and the models loaded now (live telemetry)."""

    def run(
        s: Session,
    ) -> tuple[Window, int, dict[str, tuple[str, list[stats.GpuPoint]]], dict[tuple[object, ...], Sums]]:
        window, flt = q.parse(s)
        size = stats.choose_bucket(window, bucket)
        series = stats.gpu_series(s, window, flt, size)
        jobs = stats.grouped_sums(s, window, flt, ("gpu_uuid", "host"))
        return window, int(size.total_seconds()), series, jobs

    window, bucket_s, series, jobs = await db.run_sync(run)
    hosts = {uuid: host for uuid, (host, _points) in series.items()}
    hosts |= {str(k[0]): str(k[1]) for k in jobs if k[0]}  # "" gathers jobs that ran on no GPU
    usage = {str(k[0]): s for k, s in jobs.items()}
    live = await to_thread.run_sync(lambda: telemetry.read(state.redis, sorted(hosts)))
    return StatsGpus(
        window=_window(window),
        bucket_s=bucket_s,
        data=[
            GpuStats(
                uuid=uuid,
                host=host,
                live=uuid in live,
                loaded_models=live.get(uuid, {}).get("loaded_models", []),
                usage=UsageSums.of(usage.get(uuid, Sums()), window),
                series=[GpuPointPublic(**asdict(p)) for p in series.get(uuid, ("", []))[1]],
            )
            for uuid, host in sorted(hosts.items())
        ],
    )


@router.get("/tenants", response_model=StatsTenants)
async def tenants(
    db: SessionDep,
    since: Annotated[datetime | None, Query(description="ISO 8601 with a time zone; default until - 1 h")] = None,
    until: Annotated[datetime | None, Query(description="ISO 8601 with a time zone; default now")] = None,
) -> StatsTenants:
    """Each tenant's share of the fleet: its jobs running now, of all running, and the run time
    of its jobs that finished in the window, of all such run time (fair shares between tenants)."""
    window = parse_window(since, until)
    shares = await db.run_sync(lambda s: tenant_shares(s, since=window.since, until=window.until))
    return StatsTenants(window=_window(window), data=[TenantSharePublic(**asdict(t)) for t in shares])


@router.get("/queues", response_model=StatsQueues)
async def queues(
    db: SessionDep,
    state: StateDep,
    model: str | None = None,
    kind: str | None = None,
    priority: Annotated[PriorityName | None, Query(description="high, normal or low")] = None,
) -> StatsQueues:
    """Jobs waiting now per model, kind and priority (from the queues), with how long the front one has waited."""

    flt = await db.run_sync(lambda s: parse_filter(s, model=model, kind=kind, priority=priority))
    depths = await queue_depths_async(db, state.redis, flt)  # Redis in a thread, SQL in run_sync
    return StatsQueues(data=[QueueDepthPublic(**asdict(d)) for d in depths])
