"""Daily rollups of finished jobs, so that stats over weeks read thousands of rows, not millions.

Two tables, rebuilt from ``jobs`` (the source of truth) one whole UTC day at a time:

- ``job_stats_daily``: counts and sums (tokens, run time, GPU-seconds, joules, and how many
  jobs had each figure) per day and per combination of every stats filter;
- ``job_latency_daily``: queue-wait and run-time histograms per day, model, kind and priority,
  in log-spaced bins of 1/8 octave.

A day is rolled up once it ended ``ROLLUP_GRACE`` ago: outcomes are written within seconds
of a job's end (``finished_at`` is the time of the write, or a few seconds before it), so
no row lands in a day after it was rolled up. Stats read the rollups for whole rolled-up
days inside their window and the job rows for the rest (the window's edges and the days
not yet rolled up), so sums and counts are exact. ``refresh`` runs before each stats query
and does nothing when it is up to date; concurrent refreshes are harmless (a duplicate
day fails on the primary key and is rolled back: the other writer already did it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Float, case, cast, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuq.models import Job, JobLatencyDaily, JobStatsDaily, JobStatus, utcnow

DAY = timedelta(days=1)
ROLLUP_GRACE = timedelta(minutes=15)
BINS_PER_OCTAVE = 8
# A bin spans a factor 2**(1/8) = 1.09; reporting its geometric middle is off by at most
# 2**(1/16) - 1 = 4.4% from any value in it.
MAX_RELATIVE_ERROR = 2 ** (1 / (2 * BINS_PER_OCTAVE)) - 1
FINAL = tuple(s.value for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED))


# ---------------------------------------------------------------- bins


def latency_bin(ms: float) -> int:
    """Bin 0 holds [0, 1) ms; bin b >= 1 holds [2**((b-1)/8), 2**(b/8)) ms."""
    if ms < 1:
        return 0
    return 1 + math.floor(math.log2(ms) * BINS_PER_OCTAVE)


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


# ---------------------------------------------------------------- SQL pieces shared with gpuq.stats


def epoch_s(column: Any, dialect: str) -> ColumnElement[float]:
    """Seconds since 1970 of a timestamp column, on either database."""
    if dialect == "sqlite":
        return cast(func.strftime("%s", column), Float) + (
            cast(func.strftime("%f", column), Float) - cast(func.strftime("%S", column), Float)
        )
    return func.extract("epoch", column)


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
    last = session.scalar(select(func.max(JobStatsDaily.day)))
    return None if last is None else day_start(_aware(last)) + DAY


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def refresh(session: Session, *, now: datetime | None = None) -> int:
    """Roll up every whole day that ended ``ROLLUP_GRACE`` ago and is not yet rolled up.
    Returns the number of days written (0 when up to date, or when another process won)."""
    target = day_start((now or utcnow()) - ROLLUP_GRACE)
    start = rolled_until(session)
    if start is None:
        first = session.scalar(select(func.min(Job.finished_at)).where(Job.finished_at.is_not(None)))
        if first is None:
            return 0
        start = day_start(_aware(first))
    session.commit()  # end the read so the writes below are one short transaction per day
    days = 0
    day = start
    while day < target:
        try:
            _roll_up_day(session, day)
            session.commit()
        except IntegrityError:
            session.rollback()  # another refresh wrote this day first: it is there
            return days
        days += 1
        day += DAY
    return days


def _roll_up_day(session: Session, day: datetime) -> None:
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
    if rows:
        session.execute(
            insert(JobStatsDaily),
            [{"day": day, **dict(zip(names + tuple(sums), row, strict=True))} for row in rows],
        )
    dialect = session.get_bind().dialect.name
    values = session.execute(
        select(Job.model, Job.kind, Job.priority, wait_ms(dialect), Job.run_ms).where(
            *in_day, Job.started_at.is_not(None)
        )
    )
    histograms = latency_histograms(values)
    if histograms:
        session.execute(
            insert(JobLatencyDaily),
            [
                {"day": day, "model": m, "kind": k, "priority": p, "metric": metric, "bin": b, "jobs": n}
                for (m, k, p, metric, b), n in histograms.items()
            ],
        )


def latency_histograms(rows: Iterable[Sequence[Any]]) -> Counter[tuple[str, str, int, str, int]]:
    """Count (model, kind, priority, wait_ms, run_ms) rows into (model, kind, priority, metric, bin)."""
    counts: Counter[tuple[str, str, int, str, int]] = Counter()
    for model, kind, priority, wait, run in rows:
        if wait is not None:
            counts[(model, kind, priority, "wait", latency_bin(max(float(wait), 0.0)))] += 1
        if run is not None:
            counts[(model, kind, priority, "run", latency_bin(run))] += 1
    return counts
