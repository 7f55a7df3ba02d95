"""Rollups of finished jobs and GPU samples, so that stats over weeks read thousands of rows, not millions.

Rebuilt from ``jobs`` and ``gpu_samples`` (the source of truth) one whole UTC day at a time,
into five tables written in one transaction per day:

- ``stats_rolled_days``: the day itself, so the rollups say where they end even when a day
  had no job and no sample;
- ``job_stats_daily``: counts and sums (tokens, run time, GPU-seconds, joules, and how many
  jobs had each figure) per day and per combination of every stats filter;
- ``job_latency_daily``: queue-wait and run-time histograms per day, model, kind and
  priority, in log-spaced bins of 1/8 octave;
- ``job_latency_dim_daily``: the same histograms per day, model and one tenant, host or GPU;
- ``job_stats_hourly``: jobs and tokens per hour, model, kind, priority and status
  (hourly throughput charts);
- ``gpu_samples_hourly``: per hour and GPU, sample count, sums and counts of utilisation
  and power (means stay exact when hours are added up), and maxima of memory and temperature.

A day is rolled up once it ended ``ROLLUP_GRACE`` ago: outcomes and samples are written
within seconds of the moment they carry, so no row lands in a day after it was rolled up.
Stats read the rollups for whole rolled-up days inside their window and the source rows for
the rest (the window's edges and the days not yet rolled up), so sums and counts are exact.
``refresh`` runs before each stats query and does nothing when it is up to date; concurrent
refreshes are harmless (a duplicate day fails on the primary key of ``stats_rolled_days``
and is rolled back: the other writer already did it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Float, Integer, case, cast, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    GpuSample,
    GpuSampleHourly,
    Job,
    JobLatencyDaily,
    JobLatencyDimDaily,
    JobStatsDaily,
    JobStatsHourly,
    JobStatus,
    StatsRolledDay,
    utcnow,
)

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
ROLLUP_GRACE = timedelta(minutes=15)
BINS_PER_OCTAVE = 8
# A bin spans a factor 2**(1/8) = 1.09; reporting its geometric middle is off by at most
# 2**(1/16) - 1 = 4.4% from any value in it.
MAX_RELATIVE_ERROR = 2 ** (1 / (2 * BINS_PER_OCTAVE)) - 1
FINAL = tuple(s.value for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED))


# ---------------------------------------------------------------- bins


# Added before the floor so that Python's log2 and PostgreSQL's ln(x)/ln(2), which can differ
# in the last bit, put a value lying exactly on a bin edge (a power of two) in the same bin.
BIN_NUDGE = 1e-9


def latency_bin(ms: float) -> int:
    """Bin 0 holds [0, 1) ms; bin b >= 1 holds [2**((b-1)/8), 2**(b/8)) ms."""
    if ms < 1:
        return 0
    return 1 + math.floor(math.log2(ms) * BINS_PER_OCTAVE + BIN_NUDGE)


def latency_bin_sql(value: Any) -> ColumnElement[int]:
    """``latency_bin`` in PostgreSQL, so a window's edges are binned where the rows are."""
    octaves = func.ln(value) / math.log(2)
    return case((value < 1, 0), else_=1 + func.floor(octaves * BINS_PER_OCTAVE + BIN_NUDGE))


def bin_value(b: int) -> float:
    """The geometric middle of bin ``b``: what a percentile falling in it reports."""
    if b == 0:
        return 0.0
    return 2 ** ((b - 0.5) / BINS_PER_OCTAVE)


def nearest_rank(sorted_values: Sequence[float], p: float) -> float | None:
    """The p-quantile by the nearest-rank method: the smallest value with at least p of all at or below it."""
    if not sorted_values:
        return None
    return sorted_values[max(math.ceil(p * len(sorted_values)), 1) - 1]


def histogram_rank(bins: dict[int, int], p: float) -> float | None:
    """``nearest_rank`` over a histogram: the middle of the bin that holds that rank."""
    total = sum(bins.values())
    if total == 0:
        return None
    rank, seen = max(math.ceil(p * total), 1), 0
    for b in sorted(bins):
        seen += bins[b]
        if seen >= rank:
            return bin_value(b)
    raise AssertionError("unreachable: the ranks add up to the total")


# ---------------------------------------------------------------- SQL pieces shared with gpuq.stats.queries


def epoch_s(column: Any, dialect: str) -> ColumnElement[float]:
    """Seconds since 1970 of a timestamp column, on either database."""
    if dialect == "sqlite":
        return cast(func.strftime("%s", column), Float) + (
            cast(func.strftime("%f", column), Float) - cast(func.strftime("%S", column), Float)
        )
    # extract() is numeric on PostgreSQL 14+, whose ln() and sorting are many times slower
    # than double precision's; a double holds today's epoch to the microsecond.
    return cast(func.extract("epoch", column), Float)


def bucket_index(column: Any, size_s: int, dialect: str) -> ColumnElement[int]:
    """Which ``size_s``-second bucket since 1970 a timestamp column falls in (floor on both
    databases: the times are after 1970, so SQLite's cast truncates the same way)."""
    seconds = epoch_s(column, dialect) / size_s
    return func.floor(seconds) if dialect == "postgresql" else cast(seconds, Integer)


def wait_ms(dialect: str) -> ColumnElement[float]:
    """Queue wait of a job in ms: started_at - created_at."""
    return (epoch_s(Job.started_at, dialect) - epoch_s(Job.created_at, dialect)) * 1000


def job_sums() -> list[Any]:
    """The aggregates ``job_stats_daily`` stores, over whatever job rows are grouped."""
    generated = Job.completion_tokens.is_not(None)
    return [
        func.count().label("jobs"),
        func.coalesce(func.sum(Job.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(Job.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(Job.run_ms), 0).label("run_ms"),
        func.coalesce(func.sum(case((generated, Job.run_ms), else_=0)), 0).label("generated_run_ms"),
        func.coalesce(func.sum(Job.gpu_seconds), 0.0).label("gpu_seconds"),
        func.count(Job.gpu_seconds).label("gpu_seconds_jobs"),
        func.coalesce(func.sum(Job.energy_j), 0.0).label("energy_j"),
        func.count(Job.energy_j).label("energy_jobs"),
    ]


def rollup_sums() -> list[Any]:
    """The same aggregates, summed over rollup rows."""
    r = JobStatsDaily
    columns = (
        r.jobs,
        r.prompt_tokens,
        r.completion_tokens,
        r.run_ms,
        r.generated_run_ms,
        r.gpu_seconds,
        r.gpu_seconds_jobs,
        r.energy_j,
        r.energy_jobs,
    )
    return [func.coalesce(func.sum(c), 0).label(c.key) for c in columns]


# ---------------------------------------------------------------- keeping them current


def day_start(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


def rolled_until(session: Session) -> datetime | None:
    """Days before this are in the rollups; None when nothing is."""
    last = session.scalar(select(func.max(StatsRolledDay.day)))
    return None if last is None else day_start(_aware(last)) + DAY


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def refresh(session: Session, *, now: datetime | None = None) -> int:
    """Roll up every whole day that ended ``ROLLUP_GRACE`` ago and is not yet rolled up.
    Returns the number of days written (0 when up to date, or when another process won)."""
    target = day_start((now or utcnow()) - ROLLUP_GRACE)
    start = rolled_until(session)
    if start is None:
        firsts = [
            session.scalar(select(func.min(Job.finished_at)).where(Job.finished_at.is_not(None))),
            session.scalar(select(func.min(GpuSample.sampled_at))),
        ]
        known = [_aware(f) for f in firsts if f is not None]
        if not known:
            return 0
        start = day_start(min(known))
    session.commit()  # end the read so the writes below are one short transaction per day
    days = 0
    day = start
    while day < target:
        try:
            session.add(StatsRolledDay(day=day))
            session.flush()  # first: a concurrent refresh of this day waits here, then fails
            _roll_up_day(session, day)
            session.commit()
        except IntegrityError:
            session.rollback()  # another refresh wrote this day first: it is there
            return days
        days += 1
        day += DAY
    return days


def _roll_up_day(session: Session, day: datetime) -> None:
    dialect = session.get_bind().dialect.name
    in_day = (Job.finished_at >= day, Job.finished_at < day + DAY, Job.status.in_(FINAL))
    keys = (
        Job.model,
        Job.kind,
        Job.priority,
        func.coalesce(Job.owner, ""),
        func.coalesce(Job.host, ""),
        func.coalesce(Job.gpu_uuid, ""),
        Job.status,
    )
    rows = session.execute(select(*keys, *job_sums()).where(*in_day).group_by(*keys)).all()
    names = ("model", "kind", "priority", "owner", "host", "gpu_uuid", "status")
    sums = [c.name for c in job_sums()]
    _insert(session, JobStatsDaily, [{"day": day, **dict(zip(names + tuple(sums), row, strict=True))} for row in rows])

    hour = bucket_index(Job.finished_at, 3600, dialect)
    hour_keys = (hour, Job.model, Job.kind, Job.priority, Job.status)
    hourly = select(*hour_keys, func.count(), func.sum(Job.prompt_tokens), func.sum(Job.completion_tokens))
    _insert(
        session,
        JobStatsHourly,
        [
            {
                "hour": _from_index(i, 3600),
                "model": m,
                "kind": k,
                "priority": p,
                "status": st,
                "jobs": n,
                "prompt_tokens": prompt or 0,
                "completion_tokens": completion or 0,
            }
            for i, m, k, p, st, n, prompt, completion in session.execute(hourly.where(*in_day).group_by(*hour_keys))
        ],
    )

    values = session.execute(
        select(
            Job.model, Job.kind, Job.priority, Job.owner, Job.host, Job.gpu_uuid, wait_ms(dialect), Job.run_ms
        ).where(*in_day, Job.started_at.is_not(None))
    )
    by_model, by_dim = latency_histograms(values)
    _insert(
        session,
        JobLatencyDaily,
        [
            {"day": day, "model": m, "kind": k, "priority": p, "metric": metric, "bin": b, "jobs": n}
            for (m, k, p, metric, b), n in by_model.items()
        ],
    )
    _insert(
        session,
        JobLatencyDimDaily,
        [
            {"dim": dim, "value": v, "day": day, "model": m, "metric": metric, "bin": b, "jobs": n}
            for (dim, v, m, metric, b), n in by_dim.items()
        ],
    )

    s = GpuSample
    hour = bucket_index(s.sampled_at, 3600, dialect)
    samples = (
        select(
            hour,
            s.gpu_uuid,
            s.host,
            func.count(),
            func.coalesce(func.sum(s.utilization_pct), 0.0),
            func.count(s.utilization_pct),
            func.max(s.memory_used_mib),
            func.coalesce(func.sum(s.power_w), 0.0),
            func.count(s.power_w),
            func.max(s.temperature_c),
        )
        .where(s.sampled_at >= day, s.sampled_at < day + DAY)
        .group_by(hour, s.gpu_uuid, s.host)
    )
    columns = (
        "gpu_uuid",
        "host",
        "samples",
        "utilization_sum",
        "utilization_n",
        "memory_used_max",
        "power_sum",
        "power_n",
        "temperature_max",
    )
    _insert(
        session,
        GpuSampleHourly,
        [
            {"hour": _from_index(row[0], 3600), **dict(zip(columns, row[1:], strict=True))}
            for row in session.execute(samples)
        ],
    )


def _from_index(i: Any, size_s: int) -> datetime:
    return datetime.fromtimestamp(int(i) * size_s, UTC)


def _insert(session: Session, table: Any, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(table), rows)


DIMS = (("tenant", 3), ("host", 4), ("gpu", 5))  # the dimension and its place in a latency_histograms row
ALL_MODELS = "*"  # job_latency_dim_daily's model for every model together (no model name is "*")


def latency_histograms(
    rows: Iterable[Sequence[Any]],
) -> tuple[Counter[tuple[str, str, int, str, int]], Counter[tuple[str, str, str, str, int]]]:
    """Count (model, kind, priority, owner, host, gpu_uuid, wait_ms, run_ms) rows into bins
    (model, kind, priority, metric, bin) and (dim, value, model, metric, bin), the latter once
    under its model and once under ``ALL_MODELS``; a null owner, host or GPU is not counted
    under that dimension (a filter on it never matches such a job)."""
    by_model: Counter[tuple[str, str, int, str, int]] = Counter()
    by_dim: Counter[tuple[str, str, str, str, int]] = Counter()
    for row in rows:
        model, kind, priority, wait, run = row[0], row[1], row[2], row[6], row[7]
        for metric, value in (("wait", None if wait is None else max(float(wait), 0.0)), ("run", run)):
            if value is None:
                continue
            b = latency_bin(value)
            by_model[(model, kind, priority, metric, b)] += 1
            for dim, place in DIMS:
                if row[place] is not None:
                    by_dim[(dim, row[place], model, metric, b)] += 1
                    by_dim[(dim, row[place], ALL_MODELS, metric, b)] += 1
    return by_model, by_dim
