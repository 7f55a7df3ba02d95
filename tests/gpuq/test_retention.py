"""Retention (`gpuq db prune`) on both databases: what ended before the cutoff goes, in
bounded transactions; what is unfinished, recent or still referred to stays; the stats of
the pruned days still answer from the rollups."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from gpuq.cli.main import main as gpuq_cli
from gpuq.db.tables import (
    Batch,
    File,
    GpuSample,
    Job,
    Schedule,
    ScheduleRun,
    WebhookDelivery,
    WorkerEvent,
    utcnow,
)
from gpuq.retention import parse_age, prune
from gpuq.stats import queries as stats
from gpuq.stats.filters import StatsFilter, Window
from gpuq.stats.rollups import day_start
from tests.conftest import both_databases

MODEL = "smollm2-135m"
# Yesterday's midday: the day of NOW is not rolled up yet, whatever the time of the run.
NOW = day_start(utcnow()) - timedelta(hours=12)
OLD = NOW - timedelta(days=100)
RECENT = NOW - timedelta(days=10)


def job(job_id: str, status: str, at, *, batch_id: str | None = None, **extra) -> Job:
    final = status in ("succeeded", "failed", "cancelled")
    return Job(
        id=job_id,
        kind="generate",
        model=MODEL,
        priority=1,
        status=status,
        request_hash="h",
        request={"prompt": "hi"},
        result={"text": "hello"} if status == "succeeded" else None,
        prompt_tokens=3,
        completion_tokens=5 if final else None,
        run_ms=100 if final else None,
        created_at=at - timedelta(seconds=2),
        started_at=at - timedelta(seconds=1) if status != "queued" else None,
        finished_at=at if final else None,
        batch_id=batch_id,
        **extra,
    )


def batch(batch_id: str, status: str, at, *, input_file_id: str, output_file_id: str | None = None) -> Batch:
    ended = {"completed_at": at} if status == "completed" else {}
    return Batch(
        id=batch_id,
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        output_file_id=output_file_id,
        completion_window="24h",
        status=status,
        priority=2,
        total=2,
        created_at=at - timedelta(minutes=5),
        expires_at=at + timedelta(days=1),
        **ended,
    )


def file(file_id: str, at, directory: Path, *, on_disk: bool = True) -> File:
    path = directory / f"{file_id}.jsonl"
    if on_disk:
        path.write_text('{"custom_id": "a"}\n')
    return File(
        id=file_id, purpose="batch", filename="in.jsonl", bytes=1000, line_count=1, path=str(path), created_at=at
    )


def delivery(delivery_id: str, status: str, at) -> WebhookDelivery:
    return WebhookDelivery(
        id=delivery_id, event="job.succeeded", url="http://127.0.0.1:9/", payload={}, status=status,
        next_attempt_at=at, created_at=at,
    )  # fmt: skip


def sample(at, gpu: str = "GPU-SIM-00-x") -> GpuSample:
    return GpuSample(gpu_uuid=gpu, host="h", sampled_at=at, memory_used_mib=1, memory_total_mib=2)


@pytest.fixture
def history(session: Session, tmp_path: Path) -> Path:
    """Old and recent rows of every kind prune looks at; returns the files' directory."""
    files = tmp_path / "files"
    files.mkdir()
    schedule = Schedule(
        name="nightly", cron="0 3 * * *", timezone="UTC", input_file_id="file_schedule", endpoint="/v1/embeddings",
        priority=2, misfire="skip", next_fire_at=NOW + timedelta(hours=1), created_at=OLD,
    )  # fmt: skip
    session.add_all(
        [
            job("job_old_ok", "succeeded", OLD),
            job("job_old_failed", "failed", OLD),
            job("job_old_cancelled", "cancelled", OLD),
            job("job_old_queued", "queued", OLD),  # unfinished: stays however old
            job("job_old_running", "running", OLD, worker="w"),
            job("job_recent", "succeeded", RECENT),
            # A finished batch: it, its jobs and its files go.
            batch("batch_old_done", "completed", OLD, input_file_id="file_in_done", output_file_id="file_out_done"),
            job("job_b1", "succeeded", OLD, batch_id="batch_old_done", custom_id="a"),
            job("job_b2", "failed", OLD, batch_id="batch_old_done", custom_id="b"),
            file("file_in_done", OLD, files),
            file("file_out_done", OLD, files),
            # A batch still running, however old: it, its jobs (even finished ones) and its input stay.
            batch("batch_old_running", "in_progress", OLD, input_file_id="file_in_running"),
            job("job_r1", "succeeded", OLD, batch_id="batch_old_running", custom_id="a"),
            job("job_r2", "queued", OLD, batch_id="batch_old_running", custom_id="b"),
            file("file_in_running", OLD, files),
            file("file_schedule", OLD, files),  # a schedule's input: stays
            file("file_orphan", OLD, files, on_disk=False),  # its bytes are on another machine
            file("file_recent", RECENT, files),
            schedule,
            delivery("whd_old_delivered", "delivered", OLD),
            delivery("whd_old_failed", "failed", OLD),
            delivery("whd_old_pending", "pending", OLD),  # still being retried: stays
            delivery("whd_recent", "delivered", RECENT),
            sample(OLD),
            sample(OLD + timedelta(minutes=1)),
            sample(RECENT),
            WorkerEvent(at=OLD, kind="crashed", host="h", slot="cpu", exit_status=-9),
            WorkerEvent(at=RECENT, kind="started", host="h", slot="cpu"),
        ]
    )
    session.flush()
    session.add_all(
        [
            ScheduleRun(schedule_id=schedule.id, fire_time=OLD, trigger="cron", created_at=OLD),
            ScheduleRun(schedule_id=schedule.id, fire_time=RECENT, trigger="cron", created_at=RECENT),
        ]
    )
    session.commit()
    return files


def ids(session: Session, table) -> set:
    session.expire_all()
    key = table.__mapper__.primary_key[0]
    return set(session.scalars(select(key)))


def old_day_summary(session: Session) -> stats.Summary:
    """The pruned day, whole: read from the rollups, not from job rows."""
    since = day_start(OLD)
    return stats.summary(session, Window(since, since + timedelta(days=1)), StatsFilter(), now=NOW)


@both_databases
def test_prune_deletes_what_ended_before_the_cutoff_and_nothing_else(session, history):
    before = old_day_summary(session)
    assert before.finished == {"succeeded": 3, "failed": 2, "cancelled": 1}  # job_r1 finished too

    report = prune(session, older_than=timedelta(days=90), now=NOW)

    assert ids(session, Job) == {"job_old_queued", "job_old_running", "job_recent", "job_r1", "job_r2"}
    assert ids(session, Batch) == {"batch_old_running"}
    assert ids(session, File) == {"file_in_running", "file_schedule", "file_recent"}
    assert sorted(p.name for p in history.iterdir()) == ["file_in_running.jsonl", "file_recent.jsonl",
                                                         "file_schedule.jsonl"]  # fmt: skip
    assert ids(session, WebhookDelivery) == {"whd_old_pending", "whd_recent"}
    assert session.scalar(select(func.count()).select_from(GpuSample)) == 1
    assert [r.fire_time for r in session.scalars(select(ScheduleRun))] == [RECENT]
    assert [e.kind for e in session.scalars(select(WorkerEvent))] == ["started"]
    assert (report.jobs, report.batches, report.batch_jobs) == (3, 1, 2)
    assert (report.files, report.file_bytes) == (3, 3000)
    assert report.files_missing == [str(history / "file_orphan.jsonl")]
    assert (report.webhook_deliveries, report.gpu_samples, report.schedule_runs, report.worker_events) == (2, 2, 1, 1)
    assert not report.held_back_by_rollups

    after = old_day_summary(session)  # the day's stats are whole: they come from the rollups
    assert after.finished == before.finished and after.sums == before.sums

    again = prune(session, older_than=timedelta(days=90), now=NOW)
    assert (again.jobs, again.batches, again.files, again.gpu_samples) == (0, 0, 0, 0)


@both_databases
def test_a_dry_run_counts_what_prune_then_deletes_and_changes_nothing(session, history):
    tables = (Job, Batch, File, WebhookDelivery, GpuSample, ScheduleRun, WorkerEvent)
    rows, on_disk = [ids(session, t) for t in tables], sorted(history.iterdir())
    counted = prune(session, older_than=timedelta(days=90), dry_run=True, now=NOW)
    assert [ids(session, t) for t in tables] == rows and sorted(history.iterdir()) == on_disk
    done = prune(session, older_than=timedelta(days=90), now=NOW)
    fields = ("jobs", "batches", "batch_jobs", "files", "file_bytes", "webhook_deliveries", "gpu_samples",
              "schedule_runs", "worker_events")  # fmt: skip
    assert {f: getattr(counted, f) for f in fields} == {f: getattr(done, f) for f in fields}
    assert counted.dry_run and counted.jobs == 3


@both_databases
def test_each_transaction_deletes_at_most_a_chunk(session, history):
    session.add_all([job(f"job_more_{i}", "succeeded", OLD) for i in range(5)])
    session.commit()
    deletes: list[int] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("DELETE FROM JOBS"):
            deletes.append(cursor.rowcount)

    commits: list[int] = []

    def committed(conn):
        commits.append(len(deletes))

    engine = session.get_bind()
    event.listen(engine, "after_cursor_execute", count)
    event.listen(engine, "commit", committed)
    try:
        report = prune(session, older_than=timedelta(days=90), chunk_rows=2, now=NOW)
    finally:
        event.remove(engine, "after_cursor_execute", count)
        event.remove(engine, "commit", committed)
    assert report.jobs == 8 and report.batch_jobs == 2
    assert sum(deletes) == 10 and max(deletes) <= 2
    # A commit after every chunk: no transaction held more than one DELETE of jobs.
    assert all(b - a <= 1 for a, b in zip([0, *commits], commits, strict=False))


@both_databases
def test_rows_of_days_the_rollups_do_not_hold_yet_are_kept(session):
    session.add_all([job("job_today", "succeeded", NOW - timedelta(hours=2)), job("job_days_ago", "succeeded", RECENT)])
    session.commit()
    report = prune(session, older_than=timedelta(hours=1), now=NOW)
    # Asked: everything that ended before an hour ago. Done: all but NOW's day, not rolled up yet.
    assert report.held_back_by_rollups and report.before == day_start(NOW)
    assert ids(session, Job) == {"job_today"} and report.jobs == 1


def test_ages_need_a_unit_and_a_positive_number():
    assert parse_age("90d") == timedelta(days=90)
    assert parse_age("12w") == timedelta(weeks=12) and parse_age("36h") == timedelta(hours=36)
    for bad in ("90", "0d", "-3d", "1.5d", "90 days", "d"):
        with pytest.raises(ValueError, match="is not an age"):
            parse_age(bad)


@both_databases
def test_the_cli_says_what_it_removed(session, history, database_url, monkeypatch):
    monkeypatch.setenv("GPUQ_DATABASE_URL", database_url)
    runner = CliRunner()
    dry = runner.invoke(gpuq_cli, ["db", "prune", "--older-than", "90d", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("would delete the history that ended before ")
    done = runner.invoke(gpuq_cli, ["db", "prune", "--older-than", "90d"])
    assert done.exit_code == 0, done.output
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    assert lines[0].startswith("deleted the history that ended before ") and "(stats rollups kept)" in lines[0]
    assert "jobs 3 outside batches" in lines
    assert "batches 1 with their 2 jobs" in lines
    assert "files 3 0.0 MiB" in lines
    assert "webhook deliveries 2 delivered or given up" in lines
    assert "GPU samples 2" in lines and "schedule runs 1" in lines
    assert any(line.startswith("1 of those files were not on this machine's disk") for line in lines)
    bad = runner.invoke(gpuq_cli, ["db", "prune", "--older-than", "90"])
    assert bad.exit_code == 2 and "'90' is not an age" in bad.output
