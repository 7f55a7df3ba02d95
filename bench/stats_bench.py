"""Stats queries on a large history: 1,000,000 job rows in PostgreSQL, each dashboard query
timed through the same ``gpuq.stats.queries`` functions the API calls, against a 200 ms target.

The rows are seeded in one ``INSERT ... SELECT generate_series`` (seconds, not minutes):
30 days of finished jobs over six models (two of them embedding models), three
priorities, twelve tenants (skewed: a few large ones), four hosts with two GPUs each (two
of the GPUs simulated, so their jobs carry no energy figure), about 3% failures with five
reasons and 0.5% cancellations; plus one GPU sample per GPU per minute. Then ANALYZE and
the daily rollups (what the running system keeps current day by day), then the timings.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import utcnow
from gpuq.queue_names import Priority
from gpuq.stats import queries as stats
from gpuq.stats.filters import MAX_WINDOW, StatsFilter, Window
from gpuq.stats.rollups import refresh

TARGET_MS = 200.0
SEED_DAYS = 30
GPUS = 8

_SEED_JOBS = """
INSERT INTO jobs (id, kind, model, priority, status, request_hash, request, error, prompt_tokens,
  completion_tokens, load_ms, run_ms, created_at, started_at, finished_at, worker, device, host,
  gpu_uuid, attempts, owner, gpu_seconds, energy_j, line_count)
SELECT 'job_' || lpad(to_hex((extract(epoch FROM created_at) * 1000)::bigint), 12, '0') || substr(md5(i::text), 1, 16),
  CASE WHEN mi >= 4 THEN 'embed' ELSE 'generate' END,
  (ARRAY['llama3-8b', 'qwen2-7b', 'mistral-7b', 'smollm2-135m', 'nomic-embed', 'bge-small'])[mi + 1],
  CASE WHEN r1 < 0.1 THEN 0 WHEN r1 < 0.8 THEN 1 ELSE 2 END,
  CASE WHEN r2 < 0.03 THEN 'failed' WHEN r2 < 0.035 THEN 'cancelled' ELSE 'succeeded' END,
  'bench', '{}'::json,
  CASE WHEN r2 < 0.03 THEN (ARRAY['CUDA error: out of memory', 'model file failed to load',
    'job timed out after 3600 s', 'worker died 3 times: gave up', 'prompt does not fit the context'])
    [1 + floor(r2 / 0.006)::int] END,
  (20 + r3 * 2000)::int,
  CASE WHEN r2 >= 0.035 AND mi < 4 THEN (10 + r4 * 500)::int END,
  CASE WHEN r4 < 0.05 THEN 800 + (r4 * 40000)::int ELSE 0 END,
  run_ms, created_at, created_at + wait_ms * interval '1 millisecond',
  created_at + (wait_ms + run_ms) * interval '1 millisecond',
  'worker-' || gpu, 'cuda:' || (gpu %% 2), 'host-' || (gpu / 2), 'GPU-bench-' || gpu, 1,
  'tenant-' || floor(r8 * r8 * 12)::int,
  CASE WHEN gpu < 6 THEN run_ms / 1000.0 END, CASE WHEN gpu < 6 THEN run_ms * (0.15 + r3 * 0.2) END, 1
FROM (
  SELECT i, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r8,
    floor(random() * 6)::int AS mi, floor(random() * %(gpus)s)::int AS gpu,
    (-ln(1 - random()) * 3000)::int AS wait_ms, (50 + -ln(1 - random()) * 4000)::int AS run_ms,
    %(now)s::timestamptz - %(days)s * interval '1 day' * (i::float8 / %(rows)s) - interval '2 minutes' AS created_at
  FROM generate_series(1, %(rows)s) AS i
) AS r
"""

_SEED_SAMPLES = """
INSERT INTO gpu_samples (gpu_uuid, host, sampled_at, utilization_pct, memory_used_mib, memory_total_mib,
  temperature_c, power_w)
SELECT 'GPU-bench-' || g, 'host-' || (g / 2), %(now)s::timestamptz - m * interval '1 minute',
  random() * 100, (random() * 80000)::int, 81920, 40 + random() * 40, CASE WHEN g < 6 THEN 100 + random() * 600 END
FROM generate_series(0, %(minutes)s - 1) AS m, generate_series(0, %(gpus)s - 1) AS g
"""


@contextmanager
def fresh_postgres(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database on the server of ``admin_url``, dropped at the end."""
    name = f"gpuq_stats_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Seeded:
    rows: int
    seed_s: float
    analyze_s: float
    rollup_s: float
    rollup_days: int


def seed(url: str, rows: int, now: datetime) -> Seeded:
    migrate.upgrade(url)
    params = {"now": now, "rows": rows, "days": SEED_DAYS, "gpus": GPUS, "minutes": SEED_DAYS * 24 * 60}
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute("SELECT setseed(0.42)")
        conn.execute(_SEED_JOBS, params)
        conn.execute(_SEED_SAMPLES, params)
        seeded = time.perf_counter()
        conn.execute("ANALYZE")
        analyzed = time.perf_counter()
    engine = sync_engine(url)
    with sync_sessions(engine)() as session:
        days = refresh(session, now=now)
    engine.dispose()
    return Seeded(rows, seeded - started, analyzed - seeded, time.perf_counter() - analyzed, days)


def queries(now: datetime) -> list[tuple[str, Callable[[Session, Window], Any]]]:
    """The dashboard's queries, as the API runs them (the API adds only serialisation)."""
    everything = StatsFilter()
    tenant = StatsFilter(tenant="tenant-0")  # the largest tenant: about 29% of all jobs
    model = StatsFilter(model="llama3-8b")
    host = StatsFilter(host="host-1")
    both = StatsFilter(tenant="tenant-0", model="llama3-8b")  # one tenant and a model: still rollups
    rows = StatsFilter(tenant="tenant-0", priority=Priority.HIGH)  # a combination: percentiles from the rows
    return [
        ("summary", lambda s, w: stats.summary(s, w, everything, now=now)),
        ("summary model=llama3-8b", lambda s, w: stats.summary(s, w, model, now=now)),
        ("summary tenant=tenant-0", lambda s, w: stats.summary(s, w, tenant, now=now)),
        ("summary host=host-1", lambda s, w: stats.summary(s, w, host, now=now)),
        ("summary tenant-0+llama3-8b", lambda s, w: stats.summary(s, w, both, now=now)),
        ("summary tenant-0+high", lambda s, w: stats.summary(s, w, rows, now=now)),
        ("throughput", lambda s, w: stats.throughput(s, w, everything, stats.choose_bucket(w, None), now=now)),
        (
            "throughput tenant=tenant-0",
            lambda s, w: stats.throughput(s, w, tenant, stats.choose_bucket(w, None), now=now),
        ),
        ("failures top 10", lambda s, w: stats.failures(s, w, everything, top=10)),
        ("energy by model", lambda s, w: stats.grouped_sums(s, w, everything, ("model",), now=now)),
        ("energy by tenant", lambda s, w: stats.grouped_sums(s, w, everything, ("owner",), now=now)),
        ("gpus: jobs per GPU", lambda s, w: stats.grouped_sums(s, w, everything, ("gpu_uuid", "host"), now=now)),
        (
            "gpus: sample series",
            lambda s, w: stats.gpu_series(s, w, everything, stats.choose_bucket(w, None), now=now),
        ),
    ]


@dataclass
class Timing:
    query: str
    window: str
    median_ms: float
    max_ms: float

    @property
    def passed(self) -> bool:
        return self.max_ms < TARGET_MS


def time_queries(url: str, now: datetime, runs: int) -> list[Timing]:
    windows = {
        "1 h": timedelta(hours=1),
        "24 h": timedelta(days=1),
        "7 d": timedelta(days=7),
        f"{MAX_WINDOW.days} d (max)": MAX_WINDOW,
    }
    engine = sync_engine(url)
    sessions = sync_sessions(engine)
    out = []
    for name, query in queries(now):
        for label, length in windows.items():
            window = Window(now - length, now)
            times = []
            for _ in range(runs + 1):  # the first run warms the connection and the caches
                with sessions() as session:
                    started = time.perf_counter()
                    query(session, window)
                    times.append((time.perf_counter() - started) * 1000)
            out.append(Timing(name, label, median(times[1:]), max(times[1:])))
    engine.dispose()
    return out


def run(admin_url: str, rows: int, runs: int) -> tuple[Seeded, list[Timing]]:
    now = utcnow().replace(microsecond=0)
    with fresh_postgres(admin_url) as url:
        seeded = seed(url, rows, now)
        return seeded, time_queries(url, now, runs)


def report(seeded: Seeded, timings: list[Timing], runs: int) -> str:
    lines = [
        f"stats queries: {seeded.rows:,} job rows over {SEED_DAYS} days in PostgreSQL; "
        f"seeded in {seeded.seed_s:.1f} s, ANALYZE {seeded.analyze_s:.1f} s, "
        f"rollups of {seeded.rollup_days} days {seeded.rollup_s:.1f} s; median and max of {runs} runs",
        f"  {'query':<26} {'window':<12} {'median ms':>10} {'max ms':>9}  target {TARGET_MS:.0f} ms",
    ]
    for t in timings:
        verdict = "pass" if t.passed else "FAIL"
        lines.append(f"  {t.query:<26} {t.window:<12} {t.median_ms:10.1f} {t.max_ms:9.1f}  {verdict}")
    failed = sum(not t.passed for t in timings)
    lines.append(f"  {len(timings) - failed} of {len(timings)} under {TARGET_MS:.0f} ms")
    return "\n".join(lines)
