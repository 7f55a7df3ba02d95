"""Every read and write of the SQL tables, as functions that say what they do.

Functions take a sync ``Session``. The asyncio API calls them through
``AsyncSession.run_sync`` so there is one implementation for every process.
State changes that race (claim, cancel, finish) are conditional UPDATEs: the database,
not timing, decides who wins.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gpuq.models import (
    AffinityRule,
    Batch,
    File,
    Gpu,
    Job,
    JobStatus,
    Model,
    Schedule,
    ScheduleRun,
    WebhookDelivery,
    utcnow,
)
from gpuq.webhooks import new_delivery


def new_job_id() -> str:
    """Time-ordered, so ids sort like creation times (handy in logs and cursors)."""
    return f"job_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


# ---------------------------------------------------------------- models


def get_model(session: Session, name: str) -> Model | None:
    return session.get(Model, name)


def list_models(session: Session) -> Sequence[Model]:
    return session.scalars(select(Model).order_by(Model.name)).all()


def save_model(session: Session, model: Model) -> Model:
    """Insert or replace a model's registration (re-registering updates path and kinds)."""
    merged = session.merge(model)
    session.commit()
    return merged


# ---------------------------------------------------------------- submitting


@dataclass(frozen=True, slots=True)
class NewJob:
    id: str
    kind: str
    model: str
    priority: int
    request: dict[str, Any]
    request_hash: str
    idempotency_key: str | None = None
    prompt_tokens: int | None = None
    batch_id: str | None = None
    custom_id: str | None = None
    line_count: int = 1
    line_number: int | None = None


def _job_rows(jobs: Sequence[NewJob]) -> list[dict[str, Any]]:
    now = utcnow()
    return [
        {
            "id": j.id,
            "kind": j.kind,
            "model": j.model,
            "priority": j.priority,
            "status": JobStatus.QUEUED.value,
            "idempotency_key": j.idempotency_key,
            "request_hash": j.request_hash,
            "request": j.request,
            "prompt_tokens": j.prompt_tokens,
            "created_at": now,
            "attempts": 0,
            "batch_id": j.batch_id,
            "custom_id": j.custom_id,
            "line_count": j.line_count,
            "line_number": j.line_number,
        }
        for j in jobs
    ]


def insert_jobs(session: Session, jobs: Sequence[NewJob]) -> list[Job]:
    """Insert queued rows in one statement and commit; returns them (detached)."""
    rows = _job_rows(jobs)
    if rows:
        session.execute(insert(Job), rows)
    session.commit()
    return [Job(**row) for row in rows]


def delete_queued_jobs(session: Session, ids: Sequence[str]) -> None:
    """Undo an insert whose enqueue failed, so no row claims to be queued without being so."""
    session.execute(delete(Job).where(Job.id.in_(ids), Job.status == JobStatus.QUEUED))
    session.commit()


def jobs_by_idempotency_keys(session: Session, keys: Iterable[str]) -> dict[str, Job]:
    keys = list(keys)
    if not keys:
        return {}
    jobs = session.scalars(select(Job).where(Job.idempotency_key.in_(keys)))
    return {j.idempotency_key: j for j in jobs if j.idempotency_key}


# ---------------------------------------------------------------- reading


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


@dataclass(frozen=True, slots=True)
class JobFilter:
    statuses: tuple[str, ...] = ()
    model: str | None = None
    kind: str | None = None
    priority: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def list_jobs(session: Session, flt: JobFilter, *, limit: int, after: str | None = None) -> tuple[list[Job], bool]:
    """Newest first, keyset-paginated: ``after`` is the last id of the previous page.

    Returns the page and whether more rows follow.
    """
    query = select(Job)
    if flt.statuses:
        query = query.where(Job.status.in_(flt.statuses))
    if flt.model is not None:
        query = query.where(Job.model == flt.model)
    if flt.kind is not None:
        query = query.where(Job.kind == flt.kind)
    if flt.priority is not None:
        query = query.where(Job.priority == flt.priority)
    if flt.created_after is not None:
        query = query.where(Job.created_at >= flt.created_after)
    if flt.created_before is not None:
        query = query.where(Job.created_at < flt.created_before)
    if after is not None:
        anchor = session.get(Job, after)
        if anchor is None:
            raise LookupError(after)
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(anchor.created_at, anchor.id))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def count_jobs_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {status: n for status, n in rows}


# ---------------------------------------------------------------- cancelling


def cancel_queued_job(session: Session, job_id: str) -> bool:
    """Queued to cancelled, only if it is still queued. True if this call cancelled it."""
    now = utcnow()
    changed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, cancel_requested_at=now, finished_at=now)
    ).rowcount
    session.commit()
    return bool(changed)


def mark_cancel_requested(session: Session, job_id: str) -> bool:
    """Record that a running job should stop; the worker makes it final."""
    changed = session.execute(
        update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING).values(cancel_requested_at=utcnow())
    ).rowcount
    session.commit()
    return bool(changed)


# ---------------------------------------------------------------- running (worker side)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: str
    kind: str
    model: str
    priority: int
    request: dict[str, Any]
    attempts: int
    started_at: datetime


# Conditional UPDATEs touch rows the session has not loaded; skipping the ORM's session
# synchronisation saves a large share of each call on the worker's hot path.
NO_SYNC = {"synchronize_session": False}


def claim_job(session: Session, job_id: str, *, worker: str, device: str) -> ClaimedJob | None:
    """Queued to running for this worker. None if someone cancelled or ran it first."""
    now = utcnow()
    row = session.execute(
        update(Job)
        .execution_options(**NO_SYNC)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(
            status=JobStatus.RUNNING,
            started_at=now,
            worker=worker,
            device=device,
            attempts=Job.attempts + 1,
            error=None,
        )
        .returning(Job.kind, Job.model, Job.priority, Job.request, Job.attempts)
    ).one_or_none()
    session.commit()
    if row is None:
        return None
    return ClaimedJob(job_id, row.kind, row.model, row.priority, row.request, row.attempts, now)


@dataclass(slots=True)
class Outcome:
    """What a worker learned by running a job; written in batches by ``record_outcomes``."""

    job_id: str
    worker: str
    status: JobStatus
    finished_at: datetime
    result: dict[str, Any] | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_ms: int | None = None
    run_ms: int | None = None
    webhook_url: str | None = None

    def as_values(self) -> dict[str, Any]:
        values = {
            "status": self.status.value,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
            "completion_tokens": self.completion_tokens,
            "load_ms": self.load_ms,
            "run_ms": self.run_ms,
        }
        if self.prompt_tokens is not None:
            values["prompt_tokens"] = self.prompt_tokens
        return values


def record_outcomes(session: Session, outcomes: Sequence[Outcome]) -> int:
    """Write final states in one transaction. Only rows still running on that worker change,
    so a job the reconciler has meanwhile handed to another worker is not overwritten."""
    written = 0
    for outcome in outcomes:
        changed = session.execute(
            update(Job)
            .execution_options(**NO_SYNC)
            .where(Job.id == outcome.job_id, Job.status == JobStatus.RUNNING, Job.worker == outcome.worker)
            .values(**outcome.as_values())
        ).rowcount
        written += changed
        if changed and outcome.webhook_url:  # the event commits with the state it reports
            session.add(
                new_delivery(
                    f"job.{outcome.status.value}", outcome.webhook_url, _job_event(outcome), job_id=outcome.job_id
                )
            )
    session.commit()
    return written


def _job_event(outcome: Outcome) -> dict[str, Any]:
    """What a job webhook says; the result itself (vectors can be large) is fetched with GET /v1/jobs/{id}."""
    return {
        "job_id": outcome.job_id,
        "status": outcome.status.value,
        "error": outcome.error,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "finished_at": outcome.finished_at.isoformat(),
    }


# ---------------------------------------------------------------- reconciling


def queued_jobs_created_before(session: Session, cutoff: datetime) -> list[tuple[str, str, str, int]]:
    """(id, model, kind, priority) of queued rows older than ``cutoff``."""
    rows = session.execute(
        select(Job.id, Job.model, Job.kind, Job.priority).where(Job.status == JobStatus.QUEUED, Job.created_at < cutoff)
    )
    return [(r.id, r.model, r.kind, r.priority) for r in rows]


def running_jobs(session: Session) -> list[tuple[str, str, str, int, str | None, int]]:
    """(id, model, kind, priority, worker, attempts) of running rows."""
    rows = session.execute(
        select(Job.id, Job.model, Job.kind, Job.priority, Job.worker, Job.attempts).where(
            Job.status == JobStatus.RUNNING
        )
    )
    return [(r.id, r.model, r.kind, r.priority, r.worker, r.attempts) for r in rows]


def return_to_queue(session: Session, job_id: str, *, worker: str | None) -> bool:
    """A job whose worker died goes back to queued (its attempts stay counted)."""
    changed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(status=JobStatus.QUEUED, worker=None, device=None, started_at=None)
    ).rowcount
    session.commit()
    return bool(changed)


def fail_abandoned_job(session: Session, job_id: str, *, worker: str | None, error: str) -> bool:
    changed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(status=JobStatus.FAILED, error=error, finished_at=utcnow())
    ).rowcount
    session.commit()
    return bool(changed)


# ---------------------------------------------------------------- GPU inventory


def upsert_gpus(session: Session, gpus: Sequence[Gpu]) -> None:
    """Record what a supervisor discovered; keeps health flags admins or workers set."""
    now = utcnow()
    for gpu in gpus:
        existing = session.get(Gpu, gpu.uuid)
        if existing is None:
            gpu.first_seen = gpu.last_seen = now
            session.add(gpu)
        else:
            existing.host, existing.index, existing.name = gpu.host, gpu.index, gpu.name
            existing.memory_total_mib, existing.simulated, existing.last_seen = gpu.memory_total_mib, gpu.simulated, now
    session.commit()


def list_gpus(session: Session) -> Sequence[Gpu]:
    return session.scalars(select(Gpu).order_by(Gpu.host, Gpu.index)).all()


def set_gpu_health(session: Session, uuid: str, *, healthy: bool, reason: str | None) -> bool:
    changed = session.execute(
        update(Gpu)
        .execution_options(**NO_SYNC)
        .where(Gpu.uuid == uuid)
        .values(healthy=healthy, unhealthy_reason=reason)
    ).rowcount
    session.commit()
    return bool(changed)


# ---------------------------------------------------------------- affinity rules


def list_rules(session: Session) -> Sequence[AffinityRule]:
    return session.scalars(select(AffinityRule).order_by(AffinityRule.precedence.desc(), AffinityRule.id)).all()


def get_rule(session: Session, rule_id: int) -> AffinityRule | None:
    return session.get(AffinityRule, rule_id)


def save_rule(session: Session, rule: AffinityRule) -> AffinityRule:
    merged = session.merge(rule)
    session.commit()
    return merged


def delete_rule(session: Session, rule_id: int) -> bool:
    deleted = session.execute(delete(AffinityRule).where(AffinityRule.id == rule_id)).rowcount
    session.commit()
    return bool(deleted)


# ---------------------------------------------------------------- files and batches


def save_file(session: Session, file: File) -> File:
    session.add(file)
    session.commit()
    return file


def get_file(session: Session, file_id: str) -> File | None:
    return session.get(File, file_id)


def insert_batch(session: Session, batch: Batch, jobs: Sequence[NewJob]) -> None:
    """The batch row and all its jobs in one transaction."""
    session.add(batch)
    session.flush()
    if jobs:
        session.execute(insert(Job), _job_rows(jobs))
    session.commit()


def delete_batch(session: Session, batch_id: str) -> None:
    """Undo a batch whose enqueue failed."""
    session.execute(delete(Job).where(Job.batch_id == batch_id))
    session.execute(delete(Batch).where(Batch.id == batch_id))
    session.commit()


def get_batch(session: Session, batch_id: str) -> Batch | None:
    return session.get(Batch, batch_id)


def list_batches(session: Session, *, limit: int, after: str | None = None) -> tuple[list[Batch], bool]:
    query = select(Batch)
    if after is not None:
        anchor = session.get(Batch, after)
        if anchor is None:
            raise LookupError(after)
        query = query.where(tuple_(Batch.created_at, Batch.id) < tuple_(anchor.created_at, anchor.id))
    rows = list(session.scalars(query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def batch_line_counts(session: Session, batch_id: str) -> dict[str, int]:
    """Input lines by the status of the job answering them."""
    rows = session.execute(
        select(Job.status, func.sum(Job.line_count)).where(Job.batch_id == batch_id).group_by(Job.status)
    )
    return {status: int(n) for status, n in rows}


def batch_jobs(session: Session, batch_id: str) -> Iterator[Job]:
    """A batch's jobs in input order, streamed (a batch may have 50,000)."""
    query = select(Job).where(Job.batch_id == batch_id).order_by(Job.line_number).execution_options(yield_per=500)
    yield from session.scalars(query)


def batches_with_status(session: Session, statuses: Sequence[str]) -> list[Batch]:
    return list(session.scalars(select(Batch).where(Batch.status.in_(statuses))))


def set_batch_status(session: Session, batch_id: str, *, old: Sequence[str], new: str, **values: Any) -> bool:
    """Move a batch from one of ``old`` to ``new`` (conditional: one scheduler wins)."""
    changed = session.execute(
        update(Batch)
        .execution_options(**NO_SYNC)
        .where(Batch.id == batch_id, Batch.status.in_(old))
        .values(status=new, **values)
    ).rowcount
    session.commit()
    return bool(changed)


def cancel_queued_batch_jobs(session: Session, batch_id: str, *, error: str) -> list[tuple[str, str, str, int]]:
    """Queued jobs of a batch to cancelled; returns them for their Redis entries to go too."""
    now = utcnow()
    rows = session.execute(
        update(Job)
        .execution_options(**NO_SYNC)
        .where(Job.batch_id == batch_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, error=error, finished_at=now, cancel_requested_at=now)
        .returning(Job.id, Job.model, Job.kind, Job.priority)
    ).all()
    session.commit()
    return [(r.id, r.model, r.kind, r.priority) for r in rows]


def running_batch_jobs(session: Session, batch_id: str) -> list[tuple[str, str | None]]:
    rows = session.execute(select(Job.id, Job.worker).where(Job.batch_id == batch_id, Job.status == JobStatus.RUNNING))
    return [(r.id, r.worker) for r in rows]


def mark_batch_cancel_requested(session: Session, batch_id: str) -> None:
    session.execute(
        update(Job)
        .execution_options(**NO_SYNC)
        .where(Job.batch_id == batch_id, Job.status == JobStatus.RUNNING)
        .values(cancel_requested_at=utcnow())
    )
    session.commit()


# ---------------------------------------------------------------- schedules


def list_schedules(session: Session) -> Sequence[Schedule]:
    return session.scalars(select(Schedule).order_by(Schedule.name)).all()


def get_schedule(session: Session, schedule_id: int) -> Schedule | None:
    return session.get(Schedule, schedule_id)


def save_schedule(session: Session, schedule: Schedule) -> Schedule:
    merged = session.merge(schedule)
    session.commit()
    return merged


def delete_schedule(session: Session, schedule_id: int) -> bool:
    deleted = session.execute(delete(Schedule).where(Schedule.id == schedule_id)).rowcount
    session.commit()
    return bool(deleted)


def schedule_runs(session: Session, schedule_id: int, *, limit: int) -> list[tuple[ScheduleRun, str | None]]:
    """Recent runs, newest first, with the status of the batch each started."""
    rows = session.execute(
        select(ScheduleRun, Batch.status)
        .outerjoin(Batch, Batch.id == ScheduleRun.batch_id)
        .where(ScheduleRun.schedule_id == schedule_id)
        .order_by(ScheduleRun.fire_time.desc())
        .limit(limit)
    )
    return [(run, status) for run, status in rows]


# ---------------------------------------------------------------- webhooks


def list_deliveries(session: Session, *, job_id: str | None, batch_id: str | None, limit: int) -> list[WebhookDelivery]:
    query = select(WebhookDelivery)
    if job_id is not None:
        query = query.where(WebhookDelivery.job_id == job_id)
    if batch_id is not None:
        query = query.where(WebhookDelivery.batch_id == batch_id)
    return list(session.scalars(query.order_by(WebhookDelivery.created_at.desc()).limit(limit)))
