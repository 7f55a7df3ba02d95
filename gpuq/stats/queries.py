"""Stats over job history: what the admin dashboard asks of SQL.

Every function answers for jobs that *finished* in a window (``gpuq.stats.filters``) and
reads whole rolled-up days from the rollups and everything else from the job (or sample)
rows (``gpuq.stats.rollups``), so counts, sums, means and maxima are exact at any window.
Percentiles are exact (nearest rank) when the window reads only job rows, or when a
tenant, host or GPU filter is combined with a kind, a priority or another of them;
otherwise they come from the latency histograms, within ``MAX_RELATIVE_ERROR`` (4.4%) of the exact value, and say so.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, false, func, or_, select
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
    utcnow,
)
from gpuq.errors import RequestError
from gpuq.stats.filters import StatsFilter, Window
from gpuq.stats.rollups import (
    ALL_MODELS,
    DAY,
    FINAL,
    HOUR,
    MAX_RELATIVE_ERROR,
    bucket_index,
    day_start,
    histogram_rank,
    job_sums,
    latency_bin,
    latency_bin_sql,
    nearest_rank,
    refresh,
    rolled_until,
    rollup_sums,
    wait_ms,
)

PERCENTILES = (0.5, 0.95, 0.99)
BUCKETS = {"1m": timedelta(minutes=1), "5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": DAY}
MAX_POINTS = 2016  # a week of 5-minute buckets: more points than a chart is wide gain nothing
RAW_BUCKET_MAX_WINDOW = timedelta(days=7)  # buckets under a day read job rows: bounded reading


# ---------------------------------------------------------------- where each part of a window is read


@dataclass(frozen=True, slots=True)
class Plan:
    """Whole rolled-up days [rollup_from, rollup_to) come from the rollups; ``raw`` ranges from jobs."""

    rollup_from: datetime | None
    rollup_to: datetime | None
    raw: tuple[tuple[datetime, datetime], ...]

    @property
    def uses_rollup(self) -> bool:
        return self.rollup_from is not None


def plan(session: Session, window: Window, *, now: datetime | None = None) -> Plan:
    refresh(session, now=now)
    rolled = rolled_until(session)
    first = day_start(window.since)
    if first < window.since:
        first += DAY
    last = min(day_start(window.until), rolled) if rolled is not None else first
    if first >= last:
        return Plan(None, None, ((window.since, window.until),))
    raw = tuple((lo, hi) for lo, hi in ((window.since, first), (last, window.until)) if lo < hi)
    return Plan(first, last, raw)


def _raw_rows(p: Plan) -> ColumnElement[bool]:
    if not p.raw:
        return false()
    return or_(*(and_(Job.finished_at >= lo, Job.finished_at < hi) for lo, hi in p.raw))


def _rollup_rows(p: Plan, flt: StatsFilter) -> list[ColumnElement[bool]]:
    r = JobStatsDaily
    pairs = ((r.owner, flt.tenant), (r.host, flt.host), (r.gpu_uuid, flt.gpu))
    return [r.day >= p.rollup_from, r.day < p.rollup_to, *_model_rows(r, flt)] + [
        c == v for c, v in pairs if v is not None
    ]


def _model_rows(r: Any, flt: StatsFilter) -> list[ColumnElement[bool]]:
    """The filter's model, kind and priority on a rollup table ``r`` (job rows: ``flt.job_conditions()``)."""
    pairs = ((r.model, flt.model), (r.kind, flt.kind), (r.priority, flt.priority))
    return [c == v for c, v in pairs if v is not None]


def _gpu_rows(t: Any, flt: StatsFilter) -> list[ColumnElement[bool]]:
    """The filter's GPU and host on a table of GPU samples ``t`` (raw or hourly)."""
    return [c == v for c, v in ((t.gpu_uuid, flt.gpu), (t.host, flt.host)) if v is not None]


@dataclass(slots=True)
class Sums:
    """Finished jobs and what they used; ``*_jobs`` count the jobs that had the figure at all
    (the CPU and simulated GPUs measure none), so a sum is never read as covering all jobs."""

    jobs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    run_ms: int = 0
    generated_run_ms: int = 0
    gpu_seconds: float = 0.0
    gpu_seconds_jobs: int = 0
    energy_j: float = 0.0
    energy_jobs: int = 0

    def add(self, row: Any) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + (getattr(row, name) or 0))

    @property
    def tokens_per_s(self) -> float | None:
        """Per-sequence decode speed: completion tokens over the summed run time of the jobs that
        made them. Sequences decoded together each count their whole run, so this falls as a
        GPU does more at once (8 together: 13.6 -> 6.0) while the fleet's throughput rises."""
        return self.completion_tokens / (self.generated_run_ms / 1000) if self.generated_run_ms else None

    def fleet_tokens_per_s(self, window: Window, *, now: datetime | None = None) -> float | None:
        """Fleet throughput: completion tokens per wall-clock second of the window, up to now
        (a window reaching into the future has not had those seconds yet)."""
        elapsed_s = (min(window.until, now or utcnow()) - window.since).total_seconds()
        return self.completion_tokens / elapsed_s if elapsed_s > 0 else None


def grouped_sums(
    session: Session, window: Window, flt: StatsFilter, by: tuple[str, ...], *, now: datetime | None = None
) -> dict[tuple[Any, ...], Sums]:
    """Sums of finished jobs grouped by job columns (``by`` names columns of both tables),
    rollup days and job rows added together. Null owner, host or GPU group as ""."""
    p = plan(session, window, now=now)
    out: dict[tuple[Any, ...], Sums] = defaultdict(Sums)
    nullable = ("owner", "host", "gpu_uuid")
    job_keys = [func.coalesce(getattr(Job, k), "") if k in nullable else getattr(Job, k) for k in by]
    raw = select(*job_keys, *job_sums()).where(_raw_rows(p), Job.status.in_(FINAL), *flt.job_conditions())
    for row in session.execute(raw.group_by(*job_keys)):
        out[tuple(row[: len(by)])].add(row)
    if p.uses_rollup:
        keys = [getattr(JobStatsDaily, k) for k in by]
        rolled = select(*keys, *rollup_sums()).where(*_rollup_rows(p, flt)).group_by(*keys)
        for row in session.execute(rolled):
            out[tuple(row[: len(by)])].add(row)
    return dict(out)


# ---------------------------------------------------------------- summary


@dataclass(slots=True)
class Percentiles:
    jobs: int
    values_ms: dict[str, float | None]  # "p50", "p95", "p99"
    exact: bool
    max_relative_error: float  # 0 when exact


@dataclass(slots=True)
class Summary:
    window: Window
    finished: dict[str, int]  # succeeded / failed / cancelled in the window
    in_flight: dict[str, int]  # queued / running now (filters apply, the window does not)
    sums: Sums
    queue_wait: Percentiles
    run_time: Percentiles
    by_status: dict[str, Sums] = field(default_factory=dict)


def summary(session: Session, window: Window, flt: StatsFilter, *, now: datetime | None = None) -> Summary:
    """Counts by status, tokens, energy, and queue-wait and run-time percentiles."""
    by_status = {key[0]: s for key, s in grouped_sums(session, window, flt, ("status",), now=now).items()}
    total = Sums()
    for s in by_status.values():
        total.add(s)
    live = session.execute(
        select(Job.status, func.count())
        .where(Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)), *flt.job_conditions())
        .group_by(Job.status)
    )
    in_flight = {JobStatus.QUEUED.value: 0, JobStatus.RUNNING.value: 0} | {status: n for status, n in live}
    wait, run = latency_percentiles(session, window, flt, now=now)
    return Summary(
        window=window,
        finished={status: by_status[status].jobs if status in by_status else 0 for status in FINAL},
        in_flight=in_flight,
        sums=total,
        queue_wait=wait,
        run_time=run,
        by_status=by_status,
    )


def latency_percentiles(
    session: Session, window: Window, flt: StatsFilter, *, now: datetime | None = None
) -> tuple[Percentiles, Percentiles]:
    """p50/p95/p99 of queue wait (started - created) and run time (run_ms) of finished jobs that ran."""
    p = plan(session, window, now=now)
    dialect = session.get_bind().dialect.name
    source = flt.latency_source
    if not p.uses_rollup or source == "rows":
        return _exact(session, window, flt, dialect)
    histograms: dict[str, Counter[int]] = {"wait": Counter(), "run": Counter()}
    if source == "dim":
        [(dim, value)] = flt.scoped
        d = JobLatencyDimDaily
        model = ALL_MODELS if flt.model is None else flt.model
        conditions = [d.dim == dim, d.value == value, d.model == model, d.day >= p.rollup_from, d.day < p.rollup_to]
        metric_bin: tuple[Any, Any, Any] = (d.metric, d.bin, d.jobs)
    else:
        r = JobLatencyDaily
        conditions = [r.day >= p.rollup_from, r.day < p.rollup_to, *_model_rows(r, flt)]
        metric_bin = (r.metric, r.bin, r.jobs)
    metric, b, jobs = metric_bin
    for name, bin_, n in session.execute(select(metric, b, func.sum(jobs)).where(*conditions).group_by(metric, b)):
        histograms[name][bin_] += int(n)
    # The window's edges and the days not rolled up yet, binned the same way.
    ran = (_raw_rows(p), Job.status.in_(FINAL), Job.started_at.is_not(None), *flt.job_conditions())
    _add_row_bins(session, ran, dialect, histograms)
    return _from_histogram(histograms["wait"]), _from_histogram(histograms["run"])


def _add_row_bins(session: Session, ran: tuple[Any, ...], dialect: str, histograms: dict[str, Counter[int]]) -> None:
    """Add the queue wait and run time of the job rows matching ``ran`` to the histograms."""
    if dialect == "postgresql":
        # Binned in SQL, both metrics in one scan: a few hundred bins come back, not the rows.
        # A row of the wait set has run_bin null; of the run set, wait_bin null (and a job
        # without a run time makes a row with both null, skipped).
        wait_bin, run_bin = latency_bin_sql(wait_ms(dialect)), latency_bin_sql(Job.run_ms)
        binned = select(wait_bin, run_bin, func.count()).where(*ran).group_by(func.grouping_sets(wait_bin, run_bin))
        for wait, run, n in session.execute(binned):
            if wait is not None:
                histograms["wait"][int(wait)] += int(n)
            elif run is not None:
                histograms["run"][int(run)] += int(n)
    else:
        for row_wait, row_run in session.execute(select(wait_ms(dialect), Job.run_ms).where(*ran)):
            if row_wait is not None:
                histograms["wait"][latency_bin(max(float(row_wait), 0.0))] += 1
            if row_run is not None:
                histograms["run"][latency_bin(row_run)] += 1


def _from_histogram(bins: Counter[int]) -> Percentiles:
    values = {f"p{round(q * 100)}": _round(histogram_rank(bins, q)) for q in PERCENTILES}
    return Percentiles(sum(bins.values()), values, exact=False, max_relative_error=round(MAX_RELATIVE_ERROR, 4))


def _exact(session: Session, window: Window, flt: StatsFilter, dialect: str) -> tuple[Percentiles, Percentiles]:
    """Queue-wait and run-time percentiles from the job rows of the window."""
    conditions = (
        Job.finished_at >= window.since,
        Job.finished_at < window.until,
        Job.status.in_(FINAL),
        Job.started_at.is_not(None),
        *flt.job_conditions(),
    )
    values = (wait_ms(dialect), Job.run_ms)
    found: list[tuple[int, list[float | None]]]  # (count, the value at each of PERCENTILES) for each of values
    if dialect == "postgresql":
        # percentile_disc is the nearest-rank method: the same definition as the Python path.
        # Both in one pass over the rows; ordered-set aggregates skip nulls, as count(x) does.
        # Two counts, then two arrays (SQLAlchemy types each percentile_disc as one value of its column).
        row: Sequence[Any] = session.execute(
            select(
                *(func.count(v) for v in values),
                *(func.percentile_disc(list(PERCENTILES)).within_group(v) for v in values),
            ).where(*conditions)
        ).one()
        found = [(row[i], row[2 + i] or [None] * len(PERCENTILES)) for i in range(2)]
    else:
        found = []
        for value in values:
            ordered = [
                float(v)
                for v in session.scalars(select(value).where(*conditions, value.is_not(None)).order_by(value))
                if v is not None  # none are (the query skips them): this tells the type checker
            ]
            found.append((len(ordered), [nearest_rank(ordered, q) for q in PERCENTILES]))
    wait, run = (
        Percentiles(
            n,
            {f"p{round(q * 100)}": _round(v) for q, v in zip(PERCENTILES, at, strict=True)},
            exact=True,
            max_relative_error=0.0,
        )
        for n, at in found
    )
    return wait, run


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 1)


# ---------------------------------------------------------------- throughput


def choose_bucket(window: Window, bucket: str | None) -> timedelta:
    """The bucket asked for, or one that gives a readable chart for the window."""
    if bucket is None:
        for name, limit in (("1m", timedelta(hours=2)), ("5m", DAY), ("1h", RAW_BUCKET_MAX_WINDOW)):
            if window.length <= limit:
                return BUCKETS[name]
        return DAY
    if bucket not in BUCKETS:
        raise RequestError(422, f"unknown bucket {bucket!r}; use one of: {', '.join(BUCKETS)}")
    size = BUCKETS[bucket]
    if size < DAY and window.length > RAW_BUCKET_MAX_WINDOW:
        raise RequestError(
            422,
            f"bucket {bucket} is for windows up to {RAW_BUCKET_MAX_WINDOW.days} days; use bucket=1d for longer ones",
        )
    if window.length / size > MAX_POINTS:
        raise RequestError(
            422,
            f"bucket {bucket} over this window makes {int(window.length / size)} points; at most {MAX_POINTS}: "
            "choose a larger bucket or a shorter window",
        )
    return size


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    start: datetime
    succeeded: int
    failed: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int


def throughput(
    session: Session, window: Window, flt: StatsFilter, bucket: timedelta, *, now: datetime | None = None
) -> list[ThroughputPoint]:
    """Jobs finished and tokens per bucket, buckets aligned to the epoch (days at UTC midnight),
    every bucket of the window present (zeros where nothing finished)."""
    size_s = int(bucket.total_seconds())
    dialect = session.get_bind().dialect.name
    # Days read job_stats_daily (every filter); hours read job_stats_hourly, which has no
    # tenant, host or GPU: those filters narrow the job rows read instead.
    rollup: Any = None
    if bucket >= DAY:
        rollup = JobStatsDaily
    elif bucket == HOUR and not flt.scoped:
        rollup = JobStatsHourly
    p = plan(session, window, now=now) if rollup is not None else Plan(None, None, ((window.since, window.until),))
    index = bucket_index(Job.finished_at, size_s, dialect)
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    raw = select(index, Job.status, func.count(), func.sum(Job.prompt_tokens), func.sum(Job.completion_tokens))
    raw = raw.where(_raw_rows(p), Job.status.in_(FINAL), *flt.job_conditions()).group_by(index, Job.status)
    for i, status, n, prompt, completion in session.execute(raw):
        counts[int(i)].update({status: n, "prompt": prompt or 0, "completion": completion or 0})
    if p.uses_rollup:
        r = rollup
        if rollup is JobStatsDaily:
            at, conditions = r.day, _rollup_rows(p, flt)
        else:
            at, conditions = r.hour, [r.hour >= p.rollup_from, r.hour < p.rollup_to, *_model_rows(r, flt)]
        rolled = select(at, r.status, func.sum(r.jobs), func.sum(r.prompt_tokens), func.sum(r.completion_tokens))
        for start, status, n, prompt, completion in session.execute(rolled.where(*conditions).group_by(at, r.status)):
            i = int(_utc(start).timestamp()) // size_s
            counts[i].update({status: int(n), "prompt": int(prompt), "completion": int(completion)})
    first, last = int(window.since.timestamp()) // size_s, int((window.until.timestamp() - 1e-6) // size_s)
    return [
        ThroughputPoint(
            start=datetime.fromtimestamp(i * size_s, UTC),
            succeeded=counts[i][JobStatus.SUCCEEDED],
            failed=counts[i][JobStatus.FAILED],
            cancelled=counts[i][JobStatus.CANCELLED],
            prompt_tokens=counts[i]["prompt"],
            completion_tokens=counts[i]["completion"],
        )
        for i in range(first, last + 1)
    ]


# ---------------------------------------------------------------- failures


@dataclass(frozen=True, slots=True)
class FailureReason:
    reason: str
    jobs: int
    latest_job_id: str
    latest_at: datetime


REASON_CHARS = 200  # reasons that differ only after this many characters are one reason


def failures(session: Session, window: Window, flt: StatsFilter, *, top: int) -> tuple[int, list[FailureReason]]:
    """Failed jobs in the window, and the ``top`` most frequent reasons with the newest example.
    Failures are few (indexed by status and finish time), so this reads job rows."""
    reason = func.substr(func.coalesce(Job.error, "(no reason recorded)"), 1, REASON_CHARS)
    conditions = (
        Job.status == JobStatus.FAILED,
        Job.finished_at >= window.since,
        Job.finished_at < window.until,
        *flt.job_conditions(),
    )
    rows = session.execute(
        select(reason, func.count(), func.max(Job.id), func.max(Job.finished_at))
        .where(*conditions)
        .group_by(reason)
        .order_by(func.count().desc(), reason)
    ).all()
    total = sum(r[1] for r in rows)
    # ids start with their creation time in ms, so the largest is the newest job.
    return total, [FailureReason(r[0], r[1], r[2], _utc(r[3])) for r in rows[:top]]


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# ---------------------------------------------------------------- GPUs


@dataclass(frozen=True, slots=True)
class GpuPoint:
    start: datetime
    samples: int
    utilization_pct: float | None  # mean
    memory_used_mib: float | None  # max: what came closest to running out
    power_w: float | None  # mean
    temperature_c: float | None  # max


def gpu_series(
    session: Session, window: Window, flt: StatsFilter, bucket: timedelta, *, now: datetime | None = None
) -> dict[str, tuple[str, list[GpuPoint]]]:
    """Per GPU (uuid -> (host, points)): telemetry samples per bucket. Buckets of an hour or
    more read whole rolled-up days from ``gpu_samples_hourly`` (sums, counts and maxima, so
    the same figures as from the samples) and the samples for the rest."""
    size_s = int(bucket.total_seconds())
    dialect = session.get_bind().dialect.name
    p = plan(session, window, now=now) if bucket >= HOUR else Plan(None, None, ((window.since, window.until),))
    s, h = GpuSample, GpuSampleHourly
    parts = []
    if p.raw:
        index = bucket_index(s.sampled_at, size_s, dialect)
        in_raw = or_(*(and_(s.sampled_at >= lo, s.sampled_at < hi) for lo, hi in p.raw))
        parts.append(
            select(
                s.gpu_uuid,
                s.host,
                index,
                func.count(),
                func.sum(s.utilization_pct),
                func.count(s.utilization_pct),
                func.max(s.memory_used_mib),
                func.sum(s.power_w),
                func.count(s.power_w),
                func.max(s.temperature_c),
            )
            .where(in_raw, *_gpu_rows(s, flt))
            .group_by(s.gpu_uuid, s.host, index)
        )
    if p.uses_rollup:
        index = bucket_index(h.hour, size_s, dialect)
        parts.append(
            select(
                h.gpu_uuid,
                h.host,
                index,
                func.sum(h.samples),
                func.sum(h.utilization_sum),
                func.sum(h.utilization_n),
                func.max(h.memory_used_max),
                func.sum(h.power_sum),
                func.sum(h.power_n),
                func.max(h.temperature_max),
            )
            .where(
                h.hour >= p.rollup_from,
                h.hour < p.rollup_to,
                *_gpu_rows(h, flt),
            )
            .group_by(h.gpu_uuid, h.host, index)
        )
    acc: dict[tuple[str, str, int], list[Any]] = {}
    for part in parts:
        for uuid, host, i, n, util, util_n, mem, power, power_n, temp in session.execute(part):
            a = acc.setdefault((uuid, host, int(i)), [0, 0.0, 0, None, 0.0, 0, None])
            a[0] += int(n)
            a[1] += float(util or 0)
            a[2] += int(util_n or 0)
            a[3] = _max(a[3], mem)
            a[4] += float(power or 0)
            a[5] += int(power_n or 0)
            a[6] = _max(a[6], temp)
    out: dict[str, tuple[str, list[GpuPoint]]] = {}
    for (uuid, host, i), (n, util, util_n, mem, power, power_n, temp) in sorted(
        acc.items(), key=lambda kv: (kv[0][0], kv[0][2])
    ):
        point = GpuPoint(
            datetime.fromtimestamp(i * size_s, UTC),
            n,
            _r(util / util_n if util_n else None),
            _r(mem),
            _r(power / power_n if power_n else None),
            _r(temp),
        )
        out.setdefault(uuid, (host, []))[1].append(point)
    return out


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _r(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)
