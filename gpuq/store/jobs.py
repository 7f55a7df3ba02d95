"""Jobs: submitting, reading, cancelling, claiming and finishing them, and repairing them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Integer, Table, Update, bindparam, delete, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    Job,
    JobKind,
    JobStatus,
    RunOutcome,
    utcnow,
)
from gpuq.queue_names import QueueEntry
from gpuq.store._sql import NO_SYNC, commit_changed, rows_changed
from gpuq.store.job_runs import end_run, latest_run, record_run_end, record_run_start
from gpuq.store.webhooks import new_delivery


def new_job_id() -> str:
    """Time-ordered, so ids sort like creation times (handy in logs and cursors)."""
    return f"job_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


def new_job_ids(n: int) -> list[str]:
    """``n`` ids as ``new_job_id`` makes them, with one clock read and one call for randomness."""
    prefix = f"job_{int(time.time() * 1000):012x}"
    random = secrets.token_hex(8 * n)
    return [prefix + random[i : i + 16] for i in range(0, 16 * n, 16)]


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
    prompt_ids: bytes | None = None  # the prompt's tokens as the API built them (gpuq/jobs/prompt.py)
    batch_id: str | None = None
    custom_id: str | None = None
    line_count: int = 1
    line_number: int | None = None
    owner: str | None = None
    api_key_id: str | None = None
    deadline: datetime | None = None  # when it is needed by (gpuq/jobs/admission.py)


def completion_budget(kind: str, request: dict[str, Any]) -> int:
    """The most completion tokens a job may generate: a generation's ``max_tokens`` for each of
    its ``n`` choices; nothing for other kinds."""
    if kind != JobKind.GENERATE:
        return 0
    return int(request.get("max_tokens") or 0) * int(request.get("n") or 1)


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
            "completion_budget": completion_budget(j.kind, j.request),
            "prompt_ids": j.prompt_ids,
            "created_at": now,
            "deadline": j.deadline,
            "attempts": 0,
            "batch_id": j.batch_id,
            "custom_id": j.custom_id,
            "line_count": j.line_count,
            "line_number": j.line_number,
            "owner": j.owner,
            "api_key_id": j.api_key_id,
        }
        for j in jobs
    ]


def insert_jobs(session: Session, jobs: Sequence[NewJob]) -> list[Job]:
    """Insert queued rows in one statement and commit; returns them (detached)."""
    rows = _job_rows(jobs)
    if rows:
        # Core, on the Table (a mapped class's __table__ is typed as any FromClause): no ORM bookkeeping per row
        session.execute(insert(cast(Table, Job.__table__)), rows)
    session.commit()
    return [Job(**row) for row in rows]


def delete_queued_jobs(session: Session, ids: Sequence[str]) -> None:
    """Undo an insert whose enqueue failed, so no row claims to be queued without being so."""
    session.execute(delete(Job).where(Job.id.in_(ids), Job.status == JobStatus.QUEUED))
    session.commit()


def jobs_by_idempotency_keys(session: Session, keys: Iterable[str], owner: str | None) -> dict[str, Job]:
    """The tenant's jobs by idempotency key: another tenant's keys are not ours to replay."""
    keys = list(keys)
    if not keys:
        return {}
    jobs = session.scalars(select(Job).where(Job.idempotency_key.in_(keys), Job.owner == owner))
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
    owner: str | None = None
    host: str | None = None
    gpu_uuid: str | None = None
    batch_id: str | None = None
    api_key_id: str | None = None  # the key that submitted them (a revocation cancels its jobs)


def job_conditions(flt: JobFilter) -> list[ColumnElement[bool]]:
    """The WHERE conditions of a filter: one place, for listing, bulk actions and stats."""
    equal = (
        (Job.model, flt.model),
        (Job.kind, flt.kind),
        (Job.priority, flt.priority),
        (Job.owner, flt.owner),
        (Job.host, flt.host),
        (Job.gpu_uuid, flt.gpu_uuid),
        (Job.batch_id, flt.batch_id),
        (Job.api_key_id, flt.api_key_id),
    )
    conditions = [column == value for column, value in equal if value is not None]
    if flt.statuses:
        conditions.append(Job.status.in_(flt.statuses))
    if flt.created_after is not None:
        conditions.append(Job.created_at >= flt.created_after)
    if flt.created_before is not None:
        conditions.append(Job.created_at < flt.created_before)
    return conditions


def list_jobs(session: Session, flt: JobFilter, *, limit: int, after: str | None = None) -> tuple[list[Job], bool]:
    """Newest first, keyset-paginated: ``after`` is the last id of the previous page.

    Returns the page and whether more rows follow. A cursor that names no job, or another
    tenant's job in a list narrowed to one tenant, raises LookupError alike: a cursor must
    not tell a tenant that another's id exists, nor when it was made.
    """
    query = select(Job).where(*job_conditions(flt))
    if after is not None:
        anchor = session.get(Job, after)
        if anchor is None or not _same_tenant(anchor.owner, flt.owner):
            raise LookupError(after)
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(anchor.created_at, anchor.id))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def _same_tenant(row_owner: str | None, owner: str | None) -> bool:
    """Whether a row belongs in a list narrowed to ``owner`` (None: every tenant's)."""
    return owner is None or row_owner == owner


def count_jobs_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {status: n for status, n in rows}


def count_queued_jobs_of_key(session: Session, api_key_id: str) -> int:
    """The jobs submitted with this API key that wait in a queue (what ``max_queued_jobs`` bounds)."""
    query = select(func.count()).select_from(Job).where(Job.api_key_id == api_key_id, Job.status == JobStatus.QUEUED)
    return session.scalar(query) or 0


def running_jobs_of_key(session: Session, api_key_id: str) -> list[tuple[str, str | None]]:
    """(id, worker) of each job submitted with this key that runs now."""
    query = select(Job.id, Job.worker).where(Job.api_key_id == api_key_id, Job.status == JobStatus.RUNNING)
    return [(row.id, row.worker) for row in session.execute(query)]


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """What one API key submitted since a moment: its jobs (a batch's lines each count) and
    the tokens of those that finished."""

    jobs: int = 0
    tokens: int = 0


def usage_by_key_since(session: Session, since: datetime) -> dict[str, KeyUsage]:
    """Jobs submitted at ``since`` or later, by API key; keys that submitted none are absent."""
    tokens = func.coalesce(func.sum(func.coalesce(Job.prompt_tokens, 0) + func.coalesce(Job.completion_tokens, 0)), 0)
    rows = session.execute(
        select(Job.api_key_id, func.count(), tokens)
        .where(Job.created_at >= since, Job.api_key_id.is_not(None))
        .group_by(Job.api_key_id)
    )
    return {str(key_id): KeyUsage(jobs=int(n), tokens=int(t)) for key_id, n, t in rows}


def creation_times(session: Session, job_ids: Sequence[str]) -> dict[str, datetime]:
    """When each of these jobs was submitted; ids with no row are absent."""
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Job.created_at).where(Job.id.in_(job_ids)))
    return {row.id: row.created_at for row in rows}


def completion_budget_sql() -> ColumnElement[int]:
    """A row's completion budget in SQL: its column, or for a row from before migration 0022
    (which has none) the same figure read from its request."""
    request = Job.request
    from_request = func.coalesce(request["max_tokens"].as_integer(), 0) * func.coalesce(request["n"].as_integer(), 1)
    return func.coalesce(Job.completion_budget, from_request)


WORK_CHUNK_IDS = 2000  # ids per IN list: well under SQLite's limit on bound parameters


def work_of_jobs(session: Session, job_ids: Sequence[str]) -> dict[str, tuple[int | None, int]]:
    """Each job's (prompt tokens counted at submission, or None; completion budget); ids with
    no row are absent."""
    found: dict[str, tuple[int | None, int]] = {}
    budget = completion_budget_sql()
    for start in range(0, len(job_ids), WORK_CHUNK_IDS):
        chunk = job_ids[start : start + WORK_CHUNK_IDS]
        rows = session.execute(select(Job.id, Job.prompt_tokens, budget).where(Job.id.in_(chunk)))
        found.update({job_id: (prompt, int(done or 0)) for job_id, prompt, done in rows})
    return found


def count_finished_since(session: Session, model: str, kind: str, since: datetime) -> int:
    """Jobs of this model and kind that succeeded or failed at ``since`` or later: the recent pace of its workers."""
    query = select(func.count()).where(
        Job.model == model,
        Job.kind == kind,
        Job.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED)),
        Job.finished_at >= since,
    )
    return session.scalar(query) or 0


# ---------------------------------------------------------------- cancelling


def cancel_queued_job(session: Session, job_id: str) -> bool:
    """Queued to cancelled, only if it is still queued. True if this call cancelled it."""
    now = utcnow()
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, cancel_requested_at=now, finished_at=now)
    )
    return commit_changed(session, statement)


def cancel_queued_jobs_saying(session: Session, ids: Sequence[str], *, error: str) -> list[QueueEntry]:
    """Those of ``ids`` still queued to cancelled, with ``error`` as the reason; returns those
    changed (to take out of Redis)."""
    if not ids:
        return []
    now = utcnow()
    rows = session.execute(
        update(Job)
        .execution_options(**NO_SYNC)
        .where(Job.id.in_(ids), Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, error=error, cancel_requested_at=now, finished_at=now)
        .returning(*QUEUE_ENTRY_COLUMNS)
    ).all()
    session.commit()
    return [queue_entry(r) for r in rows]


def mark_cancel_requested(session: Session, job_id: str) -> bool:
    """Record that a running job should stop; the worker makes it final."""
    still_running = (Job.id == job_id, Job.status == JobStatus.RUNNING)
    statement = update(Job).where(*still_running).values(cancel_requested_at=utcnow())
    return commit_changed(session, statement)


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
    run_id: int  # its run's ``job_runs.id``: what fences the run's outcome (see ``Outcome.run_id``)
    owner: str | None = None
    created_at: datetime | None = None  # when it was submitted: queue wait = started_at - created_at
    prompt_ids: bytes | None = None  # the prompt's tokens as the API built them, if it did
    deadline: datetime | None = None  # its place when it goes back to its queue


# The worker's two statements a job (its claim and its outcome) are built once, on the jobs
# table, not the ORM entity: an ORM-enabled UPDATE spends several times SQLite's own time in
# SQLAlchemy (its bulk-persistence and cache-key steps), and the worker runs them beside a
# decoding engine whose threads want the same cores (docs/benchmarks.md, nineteenth session).
_JOBS = cast(Table, Job.__table__)
_CLAIM = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("c_id"), _JOBS.c.status == JobStatus.QUEUED)
    .values(
        status=JobStatus.RUNNING,
        started_at=bindparam("c_started_at"),
        worker=bindparam("c_worker"),
        device=bindparam("c_device"),
        host=bindparam("c_host"),
        gpu_uuid=bindparam("c_gpu_uuid"),
        attempts=_JOBS.c.attempts + 1,
        error=None,
    )
    .returning(
        _JOBS.c.kind,
        _JOBS.c.model,
        _JOBS.c.priority,
        _JOBS.c.request,
        _JOBS.c.attempts,
        _JOBS.c.owner,
        _JOBS.c.created_at,
        _JOBS.c.prompt_ids,
        _JOBS.c.deadline,
    )
)


def claim_job(
    session: Session,
    job_id: str,
    *,
    worker: str,
    device: str,
    host: str | None = None,
    gpu_uuid: str | None = None,
) -> ClaimedJob | None:
    """Queued to running for this worker. None if someone cancelled or ran it first."""
    now = utcnow()
    params = {
        "c_id": job_id,
        "c_started_at": now,
        "c_worker": worker,
        "c_device": device,
        "c_host": host,
        "c_gpu_uuid": gpu_uuid,
    }
    row = session.execute(_CLAIM, params).one_or_none()
    if row is None:
        session.commit()
        return None
    run_id = record_run_start(
        session, job_id=job_id, attempt=row.attempts, worker=worker, host=host, device=device, started_at=now
    )
    session.commit()
    return _claimed(job_id, row, now, run_id)


def claimed_by(session: Session, job_id: str, *, worker: str) -> ClaimedJob | None:
    """The job if it is running on ``worker``: a claim whose commit went through although its
    acknowledgement was lost (the connection broke after the COMMIT) is found this way."""
    row = session.execute(
        select(
            Job.kind,
            Job.model,
            Job.priority,
            Job.request,
            Job.attempts,
            Job.owner,
            Job.created_at,
            Job.started_at,
            Job.prompt_ids,
            Job.deadline,
            latest_run(_JOBS.c.id).label("run_id"),
        ).where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
    ).one_or_none()
    if row is None:
        return None
    return _claimed(job_id, row, row.started_at, row.run_id)


def _claimed(job_id: str, row: Any, started_at: datetime, run_id: int) -> ClaimedJob:
    return ClaimedJob(
        job_id,
        row.kind,
        row.model,
        row.priority,
        row.request,
        row.attempts,
        started_at,
        run_id,
        row.owner,
        row.created_at,
        row.prompt_ids,
        row.deadline,
    )


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
    cached_tokens: int | None = None  # prompt tokens whose KV was reused, not evaluated
    cached_ram_tokens: int | None = None  # ... of them, restored from the prefix cache's RAM tier
    cached_disk_tokens: int | None = None  # ... or from its disk tier
    parked_ms: int | None = None  # time its generation waited parked for more urgent jobs
    load_ms: int | None = None
    run_ms: int | None = None
    webhook_url: str | None = None
    owner: str | None = None  # of the job: its webhook delivery log belongs to this tenant
    # Measured through NVML on a real GPU (worker/energy.py); None on the CPU or a simulated GPU.
    gpu_seconds: float | None = None
    energy_j: float | None = None
    energy_share: float | None = None  # < 1 when other jobs shared the GPU (continuous batching)
    # The run that produced it (``ClaimedJob.run_id``, a ``job_runs.id``): the write is fenced
    # by it, so the outcome of an earlier run of the job never lands on a later one, even on
    # the same worker, even when the later run has the same attempt number (an admin's
    # requeue keeps the count, a refund takes it back). None writes unfenced (by status and
    # worker only), as outcomes spooled before the field existed do.
    run_id: int | None = None

    def params(self) -> dict[str, Any]:
        """The bind parameters of ``_record_outcome``."""
        return {
            "o_id": self.job_id,
            "o_worker": self.worker,
            "o_run_id": self.run_id,
            "o_status": self.status.value,
            "o_finished_at": self.finished_at,
            "o_result": self.result,
            "o_error": self.error,
            "o_prompt_tokens": self.prompt_tokens,
            "o_completion_tokens": self.completion_tokens,
            "o_cached_tokens": self.cached_tokens,
            "o_cached_ram_tokens": self.cached_ram_tokens,
            "o_cached_disk_tokens": self.cached_disk_tokens,
            "o_parked_ms": self.parked_ms,
            "o_load_ms": self.load_ms,
            "o_run_ms": self.run_ms,
            "o_gpu_seconds": self.gpu_seconds,
            "o_energy_j": self.energy_j,
            "o_energy_share": self.energy_share,
        }


def _record_outcome(*, fenced: bool) -> Update:
    held = [
        _JOBS.c.id == bindparam("o_id"),
        _JOBS.c.status == JobStatus.RUNNING,
        _JOBS.c.worker == bindparam("o_worker"),
    ]
    if fenced:
        # The job's newest run is the one that produced the outcome: run ids never repeat,
        # where attempts do (a refund takes one back, an admin's requeue keeps the count).
        held.append(latest_run(_JOBS.c.id) == bindparam("o_run_id", type_=Integer))
    return (
        update(_JOBS)
        .where(*held)
        .values(
            status=bindparam("o_status"),
            finished_at=bindparam("o_finished_at"),
            result=bindparam("o_result"),
            error=bindparam("o_error"),
            # The count the API made at submission stays where the run did not count its own.
            prompt_tokens=func.coalesce(bindparam("o_prompt_tokens", type_=Integer), _JOBS.c.prompt_tokens),
            completion_tokens=bindparam("o_completion_tokens"),
            cached_tokens=bindparam("o_cached_tokens"),
            cached_ram_tokens=bindparam("o_cached_ram_tokens"),
            cached_disk_tokens=bindparam("o_cached_disk_tokens"),
            parked_ms=bindparam("o_parked_ms"),
            load_ms=bindparam("o_load_ms"),
            run_ms=bindparam("o_run_ms"),
            gpu_seconds=bindparam("o_gpu_seconds"),
            energy_j=bindparam("o_energy_j"),
            energy_share=bindparam("o_energy_share"),
            prompt_ids=None,  # run: the request and the counts stay, the tokens need not
        )
    )


_RECORD_OUTCOME = {True: _record_outcome(fenced=True), False: _record_outcome(fenced=False)}


def record_outcomes(session: Session, outcomes: Sequence[Outcome]) -> int:
    """Write final states in one transaction. Only rows still running on that worker, in the
    run that produced the outcome, change: a job the reconciler has meanwhile handed to
    another worker, or queued again and handed back to this one, is not overwritten."""
    return len(record_outcomes_written(session, outcomes))


def record_outcomes_written(session: Session, outcomes: Sequence[Outcome]) -> set[str]:
    """``record_outcomes``, returning the ids of the rows it changed (the metrics count only those)."""
    written: set[str] = set()
    for outcome in outcomes:
        changed = rows_changed(session, _RECORD_OUTCOME[outcome.run_id is not None], outcome.params())
        if changed:
            written.add(outcome.job_id)
            ended = RunOutcome(outcome.status.value)
            if outcome.run_id is not None:
                end_run(session, outcome.run_id, outcome=ended, reason=outcome.error, ended_at=outcome.finished_at)
            else:
                record_run_end(
                    session,
                    outcome.job_id,
                    worker=outcome.worker,
                    outcome=ended,
                    reason=outcome.error,
                    ended_at=outcome.finished_at,
                )
        if changed and outcome.webhook_url:  # the event commits with the state it reports
            session.add(
                new_delivery(
                    f"job.{outcome.status.value}",
                    outcome.webhook_url,
                    _job_event(outcome),
                    job_id=outcome.job_id,
                    owner=outcome.owner,
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


# What a QueueEntry is read from.
QUEUE_ENTRY_COLUMNS = (Job.id, Job.model, Job.kind, Job.priority, Job.owner, Job.deadline)


def queue_entry(row: Any) -> QueueEntry:
    """A row selected (or returned) with ``QUEUE_ENTRY_COLUMNS``, as the entry that queues it."""
    return QueueEntry(row.id, row.model, row.kind, row.priority, row.owner, row.deadline)


def queued_jobs_created_before(session: Session, cutoff: datetime) -> list[QueueEntry]:
    """Queued rows older than ``cutoff``."""
    query = select(*QUEUE_ENTRY_COLUMNS).where(Job.status == JobStatus.QUEUED, Job.created_at < cutoff)
    return [queue_entry(r) for r in session.execute(query)]


@dataclass(frozen=True, slots=True)
class RunningJob:
    entry: QueueEntry  # where it goes back to if its worker died
    worker: str | None
    attempts: int


def running_jobs(session: Session) -> list[RunningJob]:
    query = select(*QUEUE_ENTRY_COLUMNS, Job.worker, Job.attempts).where(Job.status == JobStatus.RUNNING)
    return [RunningJob(queue_entry(r), r.worker, r.attempts) for r in session.execute(query)]


def return_to_queue(
    session: Session, job_id: str, *, worker: str | None, reason: str, refund_attempt: bool = False
) -> bool:
    """A job whose worker died (or handed it back) goes back to queued, its run ended with
    ``reason``. Its attempt stays counted, unless ``refund_attempt``: it died beside other
    jobs, and which of them brought the worker down is not known (the reconciler then has
    it run alone)."""
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(
            status=JobStatus.QUEUED,
            worker=None,
            device=None,
            started_at=None,
            attempts=Job.attempts - 1 if refund_attempt else Job.attempts,
        )
    )
    changed = rows_changed(session, statement)
    if changed:
        record_run_end(
            session, job_id, worker=worker, outcome=RunOutcome.REQUEUED, reason=reason, refunded=refund_attempt
        )
    session.commit()
    return bool(changed)


def fail_abandoned_job(session: Session, job_id: str, *, worker: str | None, error: str) -> bool:
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.worker == worker)
        .values(status=JobStatus.FAILED, error=error, finished_at=utcnow())
    )
    changed = rows_changed(session, statement)
    if changed:
        record_run_end(session, job_id, worker=worker, outcome=RunOutcome.FAILED, reason=error)
    session.commit()
    return bool(changed)
