"""What gpuq's history and queues cost in space, for sizing (docs/operations.md):

- **database bytes per finished job**, on SQLite and PostgreSQL, for a chat generation and
  a one-text embedding. Each job goes through the writes a real one gets: the API's insert
  (the request as the API stores it, taken from a real ``POST /v1/jobs``), the worker's
  claim (an UPDATE of the same columns ``claim_job`` sets) and ``record_outcomes`` in
  groups of 500 (the outcome writer's group commit), with a result of the size a worker
  writes (a 256-token answer; 576 float32 values per text for SmolLM2's embeddings).
  Three figures per job: *live* (after VACUUM FULL: rows and indexes alone), *burst* (the
  first N jobs written with no vacuum between, every row version still on disk: what a
  flood does before autovacuum catches up) and *steady* (the next N, written into the space
  a plain VACUUM freed, as autovacuum keeps it); fixed costs (the empty schema) drop out;
- **GPU sample rows** (a supervisor writes one per GPU every ``GPUQ_GPU_SAMPLE_INTERVAL_S``);
- **Redis bytes per queued job**: ``used_memory`` of a private redis-server before and
  after enqueueing jobs through gpuq's own enqueue script;
- **what ``gpuq db prune`` frees**, and how fast it deletes.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import sqlite3
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from redis import Redis
from sqlalchemy import select, update

from api.main import create_app
from bench.stats_bench import fresh_postgres
from gpuq import store
from gpuq.auth.admin_key import ensure_admin_key, read_key_file
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import GpuSample, Job, JobStatus, utcnow
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.local.redis_server import PrivateRedis
from gpuq.queue_names import QueueEntry
from gpuq.registry.models import register_bundled_model
from gpuq.retention import prune
from gpuq.settings import Settings

MODEL = "smollm2-135m"
EMBEDDING_DIMENSIONS = 576  # SmolLM2-135M's
ANSWER_TOKENS = 256  # max_tokens' default
CHARS_PER_TOKEN = 4.2  # SmolLM2's tokenizer on English prose, roughly
GROUP_COMMIT = 500
PROMPT = (
    "You are a careful assistant. Summarise the following support ticket in two sentences and "
    "name the product it is about. Ticket: the export to CSV stops at 10,000 rows and the "
    "progress bar stays at 99% until the browser tab is closed."
)
TEXT = "Export to CSV stops at 10,000 rows; the progress bar stays at 99% until the tab is closed."
JOBS: dict[str, dict[str, Any]] = {
    "generate": {"kind": "generate", "model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
    "embed": {"kind": "embed", "model": MODEL, "input": TEXT},
}


@dataclass
class Growth:
    backend: str
    kind: str
    jobs: int
    live_bytes_per_job: float  # after VACUUM FULL (SQLite: VACUUM): the rows and indexes alone
    burst_bytes_per_job: float  # the first N, written with no vacuum between: every row version on disk
    steady_bytes_per_job: float  # the next N, into the space a plain VACUUM freed (what autovacuum gives)
    write_s: float  # for the second N jobs: insert, claim, outcome


@dataclass
class Pruning:
    backend: str
    jobs: int
    seconds: float
    bytes_before: int
    bytes_after: int  # after prune and VACUUM (plain on PostgreSQL: the space stays in the files, reusable)
    bytes_after_full: int  # after VACUUM FULL (PostgreSQL) or VACUUM (SQLite): the files shrink


def _result(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind == "embed":
        vector = [
            float(_float32(rng.gauss(0, 1 / math.sqrt(EMBEDDING_DIMENSIONS)))) for _ in range(EMBEDDING_DIMENSIONS)
        ]
        return {"embeddings": [vector], "dimensions": EMBEDDING_DIMENSIONS}
    words = " ".join(rng.choice(("the", "export", "stops", "rows", "progress", "browser")) for _ in range(400))
    return {"text": words[: int(ANSWER_TOKENS * CHARS_PER_TOKEN)], "finish_reason": "length"}


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])  # a worker's vectors are float32 values


def request_as_stored(database_url: str, redis_url: str, workdir: Path, body: dict[str, Any]) -> Job:
    """One job submitted through the real API; its row as the API wrote it."""
    (workdir / "models").mkdir(exist_ok=True)
    settings = Settings(database_url=database_url, redis_url=redis_url, data_dir=workdir, models_dir=workdir / "models")
    with TestClient(create_app(settings)) as client:
        key = read_key_file(workdir)
        created = client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})
        assert created.status_code == 202, created.text
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as session:
        job = session.get(Job, created.json()["id"])
        assert job is not None
        session.expunge(job)
    engine.dispose()
    return job


def write_finished_jobs(database_url: str, template: Job, n: int, rng: random.Random) -> float:
    """n jobs like ``template``: inserted, claimed and finished as the API and a worker write them."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    started = time.perf_counter()
    with sessions() as session:
        for first in range(0, n, GROUP_COMMIT):
            count = min(GROUP_COMMIT, n - first)
            new = [
                store.NewJob(
                    id=job_id,
                    kind=template.kind,
                    model=template.model,
                    priority=template.priority,
                    request=template.request,
                    request_hash=secrets.token_hex(32),
                    prompt_tokens=template.prompt_tokens,
                    owner=template.owner,
                    api_key_id=template.api_key_id,
                )
                for job_id in store.new_job_ids(count)
            ]
            store.insert_jobs(session, new)
            ids = [j.id for j in new]
            worker = f"bench-host.gpu0.{os.getpid()}.ab12"
            session.execute(  # what claim_job sets, for the whole group at once
                update(Job)
                .where(Job.id.in_(ids))
                .values(
                    status=JobStatus.RUNNING,
                    started_at=utcnow(),
                    worker=worker,
                    device="cuda:GPU-bench-0",
                    host="bench-host",
                    gpu_uuid="GPU-bench-0",
                    attempts=Job.attempts + 1,
                    error=None,
                )
                .execution_options(synchronize_session=False)
            )
            session.commit()
            tokens = ANSWER_TOKENS if template.kind == "generate" else None
            store.record_outcomes(
                session,
                [
                    store.Outcome(
                        job_id=i,
                        worker=worker,
                        status=JobStatus.SUCCEEDED,
                        finished_at=utcnow(),
                        result=_result(template.kind, rng),
                        completion_tokens=tokens,
                        run_ms=rng.randint(50, 9000),
                        load_ms=0,
                        gpu_seconds=1.5,
                        energy_j=420.0,
                        energy_share=1.0,
                    )
                    for i in ids
                ],
            )
    engine.dispose()
    return time.perf_counter() - started


def database_bytes(database_url: str, *, full: bool = False) -> int:
    """The database's size on disk after VACUUM (FULL, with ``full``, on PostgreSQL)."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            if full:
                conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # WAL mode: pages reach the file at a checkpoint
        return os.path.getsize(path)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM FULL" if full else "VACUUM")
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


def migrated(database_url: str, workdir: Path) -> None:
    migrate.upgrade(database_url)
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as session:
        register_bundled_model(session)
        ensure_admin_key(session, workdir)
    engine.dispose()


@contextmanager
def backend_database(backend: str, postgres_url: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'gpuq.db'}"
        migrated(url, workdir)
        yield url
        return
    with fresh_postgres(postgres_url) as url:
        migrated(url, workdir)
        yield url


def measure_jobs(backend: str, kind: str, n: int, postgres_url: str, redis_url: str) -> Growth:
    rng = random.Random(42)
    with (
        tempfile.TemporaryDirectory(prefix="gpuq-bench-growth-") as tmp,
        backend_database(backend, postgres_url, Path(tmp)) as url,
    ):
        template = request_as_stored(url, redis_url, Path(tmp), JOBS[kind])
        empty = database_bytes(url, full=True)
        write_finished_jobs(url, template, n, rng)
        at_n = database_bytes(url)
        seconds = write_finished_jobs(url, template, n, rng)
        at_2n = database_bytes(url)
        live = database_bytes(url, full=True)
    return Growth(backend, kind, n, (live - empty) / (2 * n), (at_n - empty) / n, (at_2n - at_n) / n, seconds)


def measure_samples(backend: str, n: int, postgres_url: str) -> float:
    """Bytes per gpu_samples row, as ``record_gpu_samples`` writes them (a real GPU's fields)."""
    with (
        tempfile.TemporaryDirectory(prefix="gpuq-bench-growth-") as tmp,
        backend_database(backend, postgres_url, Path(tmp)) as url,
    ):
        engine = sync_engine(url)
        sizes = []
        for _round in range(2):
            with sync_sessions(engine)() as session:
                now = utcnow()
                session.add_all(
                    GpuSample(
                        gpu_uuid=f"GPU-{i % 8:08x}-bench-uuid-0000-000000000000",
                        host="bench-host",
                        sampled_at=now - timedelta(seconds=30 * i),
                        utilization_pct=87.0,
                        memory_used_mib=60000,
                        memory_total_mib=81559,
                        temperature_c=64.0,
                        power_w=412.5,
                    )
                    for i in range(n)
                )
                session.commit()
            sizes.append(database_bytes(url))
        engine.dispose()
    return (sizes[1] - sizes[0]) / n


def measure_prune(backend: str, n: int, postgres_url: str, redis_url: str) -> Pruning:
    """n generation jobs finished 100 days ago, then ``prune(older_than=90d)``."""
    rng = random.Random(7)
    with (
        tempfile.TemporaryDirectory(prefix="gpuq-bench-growth-") as tmp,
        backend_database(backend, postgres_url, Path(tmp)) as url,
    ):
        template = request_as_stored(url, redis_url, Path(tmp), JOBS["generate"])
        write_finished_jobs(url, template, n, rng)
        engine = sync_engine(url)
        with sync_sessions(engine)() as session:
            old = utcnow() - timedelta(days=100)
            finished = Job.status == JobStatus.SUCCEEDED
            session.execute(update(Job).where(finished).values(created_at=old, started_at=old, finished_at=old))
            session.commit()
            before = database_bytes(url)
            started = time.perf_counter()
            report = prune(session, older_than=timedelta(days=90))
            seconds = time.perf_counter() - started
            left = list(session.scalars(select(Job.status)))
        engine.dispose()
        assert report.jobs == n and left == [JobStatus.QUEUED], (report, left)  # the API's template job
        return Pruning(backend, n, seconds, before, database_bytes(url), database_bytes(url, full=True))


def redis_bytes_per_queued_job(n: int) -> float:
    """used_memory of a private redis-server (nothing else in it) per job queued by gpuq's enqueue."""
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-redis-") as tmp:
        private = PrivateRedis(Path(tmp), persist=False)
        redis = Redis.from_url(private.start())
        try:
            enqueue_jobs(redis, [QueueEntry(store.new_job_id(), MODEL, "generate", 1)], timeout_s=3600)  # warm up
            before = int(redis.info("memory")["used_memory"])
            entries = [QueueEntry(i, MODEL, "generate", 1) for i in store.new_job_ids(n)]
            for first in range(0, n, 2000):
                enqueue_jobs(redis, entries[first : first + 2000], timeout_s=3600)
            after = int(redis.info("memory")["used_memory"])
        finally:
            redis.close()
            private.stop()
    return (after - before) / n


def run(postgres_url: str, redis_url: str, jobs: int) -> str:
    growth = [measure_jobs(b, k, jobs, postgres_url, redis_url) for b in ("sqlite", "postgresql") for k in JOBS]
    samples = {b: measure_samples(b, jobs * 2, postgres_url) for b in ("sqlite", "postgresql")}
    pruning = [measure_prune(b, jobs, postgres_url, redis_url) for b in ("sqlite", "postgresql")]
    redis_per_job = redis_bytes_per_queued_job(jobs * 5)
    lines = [
        f"database growth: {jobs:,} then {2 * jobs:,} finished jobs, bytes per job (GB per million = bytes / 1,000):",
        "  live: after VACUUM FULL; burst: the first N with no vacuum between; steady: the next N after a plain VACUUM",
        f"  {'backend':<11} {'kind':<9} {'live':>8} {'burst':>8} {'steady':>8} {'write jobs/s':>13}",
    ]
    for g in growth:
        lines.append(
            f"  {g.backend:<11} {g.kind:<9} {g.live_bytes_per_job:8,.0f} {g.burst_bytes_per_job:8,.0f} "
            f"{g.steady_bytes_per_job:8,.0f} {g.jobs / g.write_s:13,.0f}"
        )
    for backend, per_row in samples.items():
        per_gpu_day = per_row * 86400 / 30
        lines.append(
            f"  {backend:<11} gpu sample {per_row:8,.0f} bytes/row: {per_gpu_day / 1e6:.1f} MB per GPU per day"
        )
    lines.append(f"prune of {jobs:,} generation jobs finished 100 days ago (older than 90d)")
    for p in pruning:
        rewrite = "VACUUM FULL" if p.backend == "postgresql" else "VACUUM (the file rewritten)"
        vacuumed = " and VACUUM" if p.backend == "postgresql" else ""
        lines.append(
            f"  {p.backend:<11} {p.seconds:6.1f} s ({p.jobs / p.seconds:,.0f} jobs/s, rollups included); "
            f"database {p.bytes_before / 1e6:,.1f} MB -> {p.bytes_after / 1e6:,.1f} MB after the prune"
            f"{vacuumed} -> {p.bytes_after_full / 1e6:,.1f} MB after {rewrite}"
        )
    lines.append(f"redis: {redis_per_job:,.0f} bytes per queued job ({jobs * 5:,} queued; used_memory delta)")
    return "\n".join(lines)
