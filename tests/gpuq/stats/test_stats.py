"""Stats over job history on both databases: exact counts and sums, percentiles checked
against a Python computation on the same rows, rollups that agree with the rows, queues in
a real Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis import Redis
from sqlalchemy import literal, select
from sqlalchemy.orm import Session

from gpuq.db.tables import GpuSample, GpuSampleHourly, Job, JobStatsHourly
from gpuq.errors import RequestError
from gpuq.jobs.position import job_position, queue_depths
from gpuq.queue_names import Priority
from gpuq.stats import queries as stats
from gpuq.stats.filters import MAX_WINDOW, StatsFilter, Window, parse_filter, parse_window
from gpuq.stats.rollups import (
    MAX_RELATIVE_ERROR,
    latency_bin,
    latency_bin_sql,
    nearest_rank,
    refresh,
    rolled_until,
)
from tests.conftest import both_databases

NOW = datetime(2026, 11, 20, 12, 30, tzinfo=UTC)
MODEL = "smollm2-135m"  # registered by the fixtures


def job(
    n: int,
    finished: datetime | None,
    *,
    status: str = "succeeded",
    wait_ms: int = 1000,
    run_ms: int = 2000,
    owner: str = "acme",
    gpu: str | None = "GPU-a",
    energy_j: float | None = None,
    error: str | None = None,
    tokens: int | None = 10,
    model: str = MODEL,
    priority: int = 1,
) -> Job:
    end = finished or NOW
    started = end - timedelta(milliseconds=run_ms)
    return Job(
        id=f"job_{n:012x}{n:016x}",
        kind="generate",
        model=model,
        priority=priority,
        status=status,
        request_hash="h",
        request={},
        created_at=started - timedelta(milliseconds=wait_ms),
        started_at=started if finished else None,
        finished_at=finished,
        run_ms=run_ms if finished else None,
        prompt_tokens=5,
        completion_tokens=tokens if finished else None,
        owner=owner,
        host="host-1" if gpu else None,
        gpu_uuid=gpu,
        gpu_seconds=energy_j / 100 if energy_j is not None else None,
        energy_j=energy_j,
        error=error,
    )


def last(hours: float) -> Window:
    return Window(NOW - timedelta(hours=hours), NOW)


@both_databases
def test_summary_counts_sums_and_exact_percentiles(session: Session) -> None:
    waits = [100, 250, 400, 900, 1200, 3000, 5000, 8000, 20000, 60000]
    runs = [50, 70, 90, 300, 500, 800, 1500, 4000, 9000, 30000]
    rows = [
        job(i, NOW - timedelta(minutes=i + 1), wait_ms=w, run_ms=r, energy_j=10.0 * i if i % 2 else None)
        for i, (w, r) in enumerate(zip(waits, runs, strict=True))
    ]
    rows += [job(20, NOW - timedelta(minutes=3), status="failed", wait_ms=10, run_ms=20, error="boom")]
    rows += [job(21, None, status="queued"), job(22, NOW - timedelta(hours=2))]  # outside the window
    session.add_all(rows)
    session.commit()

    result = stats.summary(session, last(1), StatsFilter(), now=NOW)

    assert result.finished == {"succeeded": 10, "failed": 1, "cancelled": 0}
    assert result.in_flight == {"queued": 1, "running": 0}
    assert result.sums.completion_tokens == 110
    assert (result.sums.energy_jobs, result.sums.energy_j) == (5, 10.0 * (1 + 3 + 5 + 7 + 9))
    assert result.queue_wait.exact and result.run_time.exact
    for name, values in (("queue_wait", [*waits, 10]), ("run_time", [*runs, 20])):
        got = getattr(result, name).values_ms
        for q in (0.5, 0.95, 0.99):
            assert got[f"p{round(q * 100)}"] == pytest.approx(nearest_rank(sorted(values), q), abs=0.5)


@both_databases
def test_long_window_reads_rollups_with_exact_counts_and_bounded_percentiles(session: Session) -> None:
    rows, runs = [], []
    for i in range(200):
        run_ms = 40 + (i * 37) % 5000
        runs.append(run_ms)
        owner = "acme" if i % 4 else "globex"
        status = "failed" if i % 10 == 0 else "succeeded"
        model = "other-model" if i % 3 == 0 else MODEL
        finished = NOW - timedelta(hours=1 + i)
        rows.append(job(i, finished, run_ms=run_ms, owner=owner, status=status, energy_j=1.0 * (i % 3), model=model))
    session.add_all(rows)
    session.commit()
    window = last(24 * 10)

    result = stats.summary(session, window, StatsFilter(), now=NOW)
    by_tenant = stats.grouped_sums(session, window, StatsFilter(), ("owner",), now=NOW)

    assert stats.plan(session, window, now=NOW).uses_rollup  # whole days came from the rollups
    assert result.finished == {"succeeded": 180, "failed": 20, "cancelled": 0}
    assert {k[0]: s.jobs for k, s in by_tenant.items()} == {"acme": 150, "globex": 50}
    assert result.sums.energy_jobs == 200 and result.sums.energy_j == sum(float(i % 3) for i in range(200))
    assert not result.run_time.exact
    for q in (0.5, 0.95, 0.99):
        exact = nearest_rank(sorted(runs), q)
        assert result.run_time.values_ms[f"p{round(q * 100)}"] == pytest.approx(exact, rel=MAX_RELATIVE_ERROR)

    # One tenant, host or GPU, alone or with a model: its own histograms, within the same bound.
    for flt, values in (
        (StatsFilter(tenant="globex"), runs[::4]),
        (StatsFilter(host="host-1"), runs),
        (StatsFilter(gpu="GPU-a"), runs),
        (StatsFilter(tenant="globex", model="other-model"), runs[::12]),
        (StatsFilter(host="host-1", model=MODEL), [r for i, r in enumerate(runs) if i % 3]),
    ):
        scoped = stats.summary(session, window, flt, now=NOW)
        assert not scoped.run_time.exact and scoped.run_time.jobs == len(values)
        for q in (0.5, 0.95, 0.99):
            exact = nearest_rank(sorted(values), q)
            assert scoped.run_time.values_ms[f"p{round(q * 100)}"] == pytest.approx(exact, rel=MAX_RELATIVE_ERROR)
    # Combined with a kind, a priority or another of them: exact from the rows.
    globex = stats.summary(session, window, StatsFilter(tenant="globex", priority=1), now=NOW)
    assert globex.run_time.exact and globex.finished["succeeded"] + globex.finished["failed"] == 50
    assert globex.run_time.values_ms["p50"] == nearest_rank(sorted(runs[::4]), 0.5)


@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)  # SQLite bins in Python
def test_postgres_bins_values_as_python_does_even_on_bin_edges(session: Session) -> None:
    values = sorted({0, 0.5, 1, 3, 999, 1001} | {2**k for k in range(25)} | {round(2 ** (k / 8)) for k in range(200)})
    got = session.execute(select(*(latency_bin_sql(literal(float(v))) for v in values))).one()
    assert [int(b) for b in got] == [latency_bin(v) for v in values]


@both_databases
def test_throughput_buckets_count_jobs_and_tokens_per_minute(session: Session) -> None:
    session.add_all(
        [
            job(1, NOW - timedelta(minutes=5, seconds=10), tokens=7),
            job(2, NOW - timedelta(minutes=5, seconds=20), tokens=3),
            job(3, NOW - timedelta(minutes=1, seconds=1), status="failed", tokens=None),
        ]
    )
    session.commit()
    window = Window(NOW - timedelta(minutes=10), NOW)

    points = stats.throughput(session, window, StatsFilter(), timedelta(minutes=1), now=NOW)

    assert len(points) == 10 and points[0].start == NOW - timedelta(minutes=10)
    by_start = {p.start: p for p in points}
    six_ago = by_start[NOW - timedelta(minutes=6)]
    assert (six_ago.succeeded, six_ago.completion_tokens) == (2, 10)
    assert by_start[NOW - timedelta(minutes=2)].failed == 1
    assert sum(p.succeeded + p.failed for p in points) == 3


@both_databases
def test_hourly_throughput_over_days_reads_the_hourly_rollup_and_matches_the_rows(session: Session) -> None:
    rows = [
        job(
            i,
            NOW - timedelta(minutes=37 * i + 5),
            status=("succeeded", "failed", "cancelled")[i % 3],
            tokens=i,
            owner=("acme", "globex")[i % 2],
            priority=i % 3,
            model=MODEL if i % 4 else "other-model",
        )
        for i in range(300)  # one every 37 minutes: about 7.7 days
    ]
    session.add_all(rows)
    session.commit()
    window = Window(NOW - timedelta(days=7, minutes=10), NOW)

    for flt in (StatsFilter(), StatsFilter(model=MODEL, priority=1), StatsFilter(tenant="acme")):
        points = stats.throughput(session, window, flt, timedelta(hours=1), now=NOW)

        expected: dict[datetime, list[int]] = {}
        for r in rows:
            assert r.finished_at is not None  # every row here is finished
            keep = window.since <= r.finished_at < window.until and all(
                getattr(r, column) == value
                for column, value in (("model", flt.model), ("priority", flt.priority), ("owner", flt.tenant))
                if value is not None
            )
            if keep:
                start = r.finished_at.replace(minute=0, second=0, microsecond=0)
                e = expected.setdefault(start, [0, 0, 0, 0])
                e[("succeeded", "failed", "cancelled").index(r.status)] += 1
                e[3] += r.completion_tokens or 0
        assert len(points) == 7 * 24 + 1
        got = {p.start: [p.succeeded, p.failed, p.cancelled, p.completion_tokens] for p in points}
        assert {k: v for k, v in got.items() if any(v)} == expected
    assert stats.plan(session, window, now=NOW).uses_rollup
    assert session.query(JobStatsHourly).count() > 0


@both_databases
def test_gpu_series_over_weeks_reads_hourly_rollups_with_the_same_figures_as_the_samples(session: Session) -> None:
    samples = []
    for minute in range(0, 12 * 24 * 60, 17):  # 12 days, no job at all: the watermark still moves
        at = NOW - timedelta(minutes=minute + 1)
        for g, host in (("GPU-a", "host-1"), ("GPU-b", "host-2")):
            samples.append(
                GpuSample(
                    gpu_uuid=g,
                    host=host,
                    sampled_at=at,
                    utilization_pct=(minute * 7) % 101 if minute % 5 else None,
                    memory_used_mib=(minute * 13) % 8000,
                    memory_total_mib=8192,
                    temperature_c=30 + (minute % 50),
                    power_w=None if g == "GPU-b" else 50.0 + minute % 300,
                )
            )
    session.add_all(samples)
    session.commit()
    window = Window(NOW - timedelta(days=10, hours=3), NOW)

    for bucket in (timedelta(days=1), timedelta(hours=1)):
        series = stats.gpu_series(session, window, StatsFilter(), bucket, now=NOW)
        gpu_b = stats.gpu_series(session, window, StatsFilter(gpu="GPU-b"), bucket, now=NOW)

        size = int(bucket.total_seconds())
        expected: dict[tuple[str, datetime], list[GpuSample]] = {}
        for x in samples:
            if window.since <= x.sampled_at < window.until:
                start = datetime.fromtimestamp(int(x.sampled_at.timestamp()) // size * size, UTC)
                expected.setdefault((x.gpu_uuid, start), []).append(x)

        def mean(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return round(sum(known) / len(known), 1) if known else None

        want = {
            key: (
                len(xs),
                mean([x.utilization_pct for x in xs]),
                float(max(x.memory_used_mib or 0 for x in xs)),
                mean([x.power_w for x in xs]),
                float(max(x.temperature_c or 0 for x in xs)),
            )
            for key, xs in expected.items()
        }
        got = {
            (uuid, p.start): (p.samples, p.utilization_pct, p.memory_used_mib, p.power_w, p.temperature_c)
            for uuid, (_host, points) in series.items()
            for p in points
        }
        assert got == want
        assert list(gpu_b) == ["GPU-b"] and gpu_b["GPU-b"][0] == "host-2"
        assert len(gpu_b["GPU-b"][1]) == len(series["GPU-b"][1])
    assert rolled_until(session) == datetime(2026, 11, 20, tzinfo=UTC)
    assert session.query(GpuSampleHourly).count() > 0
    assert refresh(session, now=NOW) == 0  # up to date: nothing written twice


@both_databases
def test_failures_are_grouped_most_frequent_first_with_the_newest_example(session: Session) -> None:
    reasons = ["CUDA error: out of memory"] * 3 + ["model failed to load"] * 2 + ["timeout"]
    session.add_all(
        [
            job(i, NOW - timedelta(minutes=10 - i), status="failed", error=reason)
            for i, reason in enumerate(reasons, start=1)
        ]
    )
    session.commit()

    total, top = stats.failures(session, last(1), StatsFilter(), top=2)

    assert total == 6
    assert [(r.reason, r.jobs) for r in top] == [("CUDA error: out of memory", 3), ("model failed to load", 2)]
    assert top[0].latest_job_id == job(3, None).id


@both_databases
def test_energy_sums_exclude_jobs_without_a_figure_and_say_how_many_had_one(session: Session) -> None:
    session.add_all(
        [
            job(1, NOW - timedelta(minutes=1), owner="acme", energy_j=100.0),
            job(2, NOW - timedelta(minutes=2), owner="acme", energy_j=None, gpu="GPU-SIM-1"),
            job(3, NOW - timedelta(minutes=3), owner="globex", energy_j=50.0),
        ]
    )
    session.commit()

    by_tenant = stats.grouped_sums(session, last(1), StatsFilter(), ("owner",), now=NOW)

    acme = by_tenant[("acme",)]
    assert (acme.jobs, acme.energy_jobs, acme.energy_j, acme.gpu_seconds_jobs) == (2, 1, 100.0, 1)
    assert by_tenant[("globex",)].energy_j == 50.0


def test_windows_that_are_naive_reversed_or_too_long_are_refused_with_what_to_fix() -> None:
    with pytest.raises(RequestError, match="no time zone"):
        parse_window(datetime(2026, 1, 1), None)
    with pytest.raises(RequestError, match="reversed"):
        parse_window(NOW, NOW - timedelta(hours=1))
    with pytest.raises(RequestError, match=f"at most {MAX_WINDOW.days} days"):
        parse_window(NOW - MAX_WINDOW - timedelta(days=1), NOW)
    assert parse_window(None, NOW).length == timedelta(hours=1)


@both_databases
def test_unknown_filter_values_are_refused_listing_the_known_ones(session: Session) -> None:
    with pytest.raises(RequestError, match=f"unknown model 'nope'; known: {MODEL}"):
        parse_filter(session, model="nope")
    with pytest.raises(RequestError, match="unknown kind 'train'"):
        parse_filter(session, kind="train")
    session.add(job(1, NOW, owner="initech", gpu="GPU-x"))
    session.commit()
    # Values found in the history are known even without a key or an inventory entry.
    assert parse_filter(session, tenant="initech", gpu="GPU-x", priority=Priority.HIGH).priority == 0


@both_databases
def test_position_counts_jobs_ahead_in_its_queue_and_higher_priorities_and_gives_an_eta(
    session: Session, redis: Redis
) -> None:
    queued = [job(i, None, status="queued", priority=1) for i in range(1, 4)]
    urgent = [job(10 + i, None, status="queued", priority=0) for i in range(2)]
    done = [job(100 + i, NOW - timedelta(seconds=29 * (i + 1))) for i in range(30)]  # 2 a minute lately
    session.add_all(queued + urgent + done)
    session.commit()
    for rows, priority in ((queued, "normal"), (urgent, "high")):
        name = f"gpuq:{MODEL}:generate:{priority}"
        redis.rpush(f"rq:queue:{name}", *[j.id for j in rows])
        redis.sadd("rq:queues", f"rq:queue:{name}")

    third = job_position(session, redis, session.get_one(Job, queued[2].id), now=NOW)
    finished = job_position(session, redis, session.get_one(Job, done[0].id), now=NOW)
    depths = queue_depths(session, redis, StatsFilter(), now=NOW)

    assert (third.position, third.ahead_in_queue, third.ahead_in_higher_priorities) == (4, 2, 2)
    # 30 jobs of 15 tokens each finished, one at a time, in 60 s of work: 7.5 tokens/s; the 4
    # jobs ahead hold 5 prompt tokens each and may generate none (no max_tokens).
    assert (third.prompt_tokens_ahead, third.completion_tokens_ahead, third.tokens_per_s) == (20, 0, 7.5)
    assert third.finished_per_min == 2.0 and third.eta_s == round(20 / 7.5, 1)
    assert finished.position is None and finished.status == "succeeded"
    assert [(d.priority, d.depth, d.front_job_id) for d in depths] == [
        ("high", 2, urgent[0].id),
        ("normal", 3, queued[0].id),
    ]
