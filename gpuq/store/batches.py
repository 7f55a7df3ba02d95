"""Batch files, batches and their jobs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    Batch,
    BatchStatus,
    File,
    Job,
    JobStatus,
    utcnow,
)
from gpuq.queue_names import QueueEntry
from gpuq.store._sql import NO_SYNC, commit_changed, rows_changed
from gpuq.store.jobs import QUEUE_ENTRY_COLUMNS, NewJob, _job_rows, _same_tenant, queue_entry
from gpuq.store.retention import delete_batch_jobs

# ---------------------------------------------------------------- files and batches


def save_file(session: Session, file: File) -> File:
    session.add(file)
    session.commit()
    return file


def get_file(session: Session, file_id: str) -> File | None:
    return session.get(File, file_id)


def list_files(
    session: Session,
    *,
    limit: int,
    after: str | None = None,
    owner: str | None = None,
    purpose: str | None = None,
    newest_first: bool = True,
) -> tuple[list[File], bool]:
    """Keyset-paginated by creation (OpenAI's order ``desc`` or ``asc``); ``owner`` narrows to one tenant's.
    A cursor naming another tenant's file raises LookupError, as a missing one does."""
    query = select(File)
    if owner is not None:
        query = query.where(File.owner == owner)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    key = tuple_(File.created_at, File.id)
    if after is not None:
        anchor = session.get(File, after)
        if anchor is None or not _same_tenant(anchor.owner, owner):
            raise LookupError(after)
        bound = tuple_(anchor.created_at, anchor.id)
        query = query.where(key < bound if newest_first else key > bound)
    order = (File.created_at.desc(), File.id.desc()) if newest_first else (File.created_at, File.id)
    rows = list(session.scalars(query.order_by(*order).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_file(session: Session, file_id: str) -> bool:
    """The file's row; True if it existed. Its bytes on disk are the caller's to remove."""
    return commit_changed(session, delete(File).where(File.id == file_id))


INSERT_CHUNK_JOBS = 500


def insert_batch(
    session: Session, batch: Batch, jobs: Iterable[NewJob], *, before_commit: Callable[[], None] | None = None
) -> None:
    """The batch row and all its jobs in one transaction, inserted a chunk at a time as
    ``jobs`` yields them (a 50,000-line batch is never in memory whole); each job is needed by
    the batch's expiry (its ``deadline``). ``before_commit`` runs once they are all written; if
    it raises, nothing is (the transaction is rolled back)."""
    session.add(batch)
    session.flush()
    pending = iter(jobs)
    while chunk := list(itertools.islice(pending, INSERT_CHUNK_JOBS)):
        rows = _job_rows(chunk)
        for row in rows:
            row["deadline"] = batch.expires_at
        # Core, on the Table (a mapped class's __table__ is typed as any FromClause): no ORM bookkeeping per row
        session.execute(insert(cast(Table, Job.__table__)), rows)
    if before_commit is not None:
        try:
            before_commit()
        except BaseException:
            session.rollback()
            raise
    session.commit()


def delete_batch(session: Session, batch_id: str) -> None:
    """Undo a batch whose enqueue failed."""
    session.execute(delete(Job).where(Job.batch_id == batch_id))
    session.execute(delete(Batch).where(Batch.id == batch_id))
    session.commit()


def delete_ended_batch(session: Session, batch_id: str, *, chunk_jobs: int) -> list[str]:
    """A batch's jobs with their runs (a chunk a transaction), then its row and the rows of
    its input and output files in one; returns those files' paths, for the caller to remove
    once the rows are gone. The caller has checked the batch ended: no job of it runs."""
    batch = session.get(Batch, batch_id)
    if batch is None:
        return []
    file_ids = [f for f in (batch.input_file_id, batch.output_file_id, batch.error_file_id) if f]
    while delete_batch_jobs(session, batch_id, limit=chunk_jobs):
        pass
    paths = list(session.scalars(select(File.path).where(File.id.in_(file_ids))))
    session.execute(delete(Batch).where(Batch.id == batch_id).execution_options(**NO_SYNC))
    session.execute(delete(File).where(File.id.in_(file_ids)).execution_options(**NO_SYNC))
    session.commit()
    return paths


def get_batch(session: Session, batch_id: str) -> Batch | None:
    return session.get(Batch, batch_id)


def list_batches(
    session: Session,
    *,
    limit: int,
    after: str | None = None,
    before: str | None = None,
    owner: str | None = None,
    endpoint: str | None = None,
    other_than: str | None = None,
) -> tuple[list[Batch], bool]:
    """Newest first, keyset-paginated: ``after`` a batch, the older ones; ``before`` it, the
    newer ones nearest it (still newest first; ``has_more``: more newer ones). ``owner``
    narrows to one tenant's, ``endpoint`` to the batches of that endpoint, ``other_than`` to
    those of any other (Message Batches are listed apart from OpenAI's). A cursor naming
    another tenant's batch raises LookupError, as a missing one does."""
    query = select(Batch)
    if owner is not None:
        query = query.where(Batch.owner == owner)
    if endpoint is not None:
        query = query.where(Batch.endpoint == endpoint)
    if other_than is not None:
        query = query.where(Batch.endpoint != other_than)
    key = tuple_(Batch.created_at, Batch.id)
    newest_first = before is None
    for cursor in (after, before):
        if cursor is not None:
            anchor = session.get(Batch, cursor)
            if anchor is None or not _same_tenant(anchor.owner, owner):
                raise LookupError(cursor)
            bound = tuple_(anchor.created_at, anchor.id)
            query = query.where(key < bound if cursor == after else key > bound)
    order = (Batch.created_at.desc(), Batch.id.desc()) if newest_first else (Batch.created_at, Batch.id)
    rows = list(session.scalars(query.order_by(*order).limit(limit + 1)))
    page = rows[:limit]
    return (page if newest_first else page[::-1]), len(rows) > limit


def batch_line_counts(session: Session, batch_id: str) -> dict[str, int]:
    """Input lines by the status of the job answering them."""
    rows = session.execute(
        select(Job.status, func.sum(Job.line_count)).where(Job.batch_id == batch_id).group_by(Job.status)
    )
    return {status: int(n) for status, n in rows}


def batch_prompt_tokens(session: Session, batch_id: str) -> tuple[int, int]:
    """(prompt tokens, of them taken from a cache) of the batch's generation jobs that ran."""
    prompt, cached = session.execute(
        select(func.sum(Job.prompt_tokens), func.sum(Job.cached_tokens)).where(
            Job.batch_id == batch_id, Job.cached_tokens.is_not(None)
        )
    ).one()
    return int(prompt or 0), int(cached or 0)


def batch_jobs(session: Session, batch_id: str) -> Iterator[Job]:
    """A batch's jobs in input order, streamed (a batch may have 50,000)."""
    query = select(Job).where(Job.batch_id == batch_id).order_by(Job.line_number).execution_options(yield_per=500)
    yield from session.scalars(query)


def batch_endpoints(session: Session, batch_id: str) -> list[str]:
    """The endpoints a batch's lines name, sorted: a file may mix them (jobs of batches from
    before lines recorded theirs count as the batch's own)."""
    endpoint = func.coalesce(Job.request["endpoint"].as_string(), Batch.endpoint)
    query = (
        select(endpoint)
        .distinct()
        .select_from(Job)
        .join(Batch, Batch.id == Job.batch_id)
        .where(Job.batch_id == batch_id)
    )
    return sorted(session.scalars(query))


def batches_with_status(session: Session, statuses: Sequence[str]) -> list[Batch]:
    return list(session.scalars(select(Batch).where(Batch.status.in_(statuses))))


def set_batch_status(session: Session, batch_id: str, *, old: Sequence[str], new: str, **values: Any) -> bool:
    """Move a batch from one of ``old`` to ``new`` (conditional: one scheduler wins)."""
    statement = (
        update(Batch)
        .execution_options(**NO_SYNC)
        .where(Batch.id == batch_id, Batch.status.in_(old))
        .values(status=new, **values)
    )
    return commit_changed(session, statement)


def finish_batch(session: Session, batch_id: str, *, new: str, rows: Sequence[object], **values: Any) -> bool:
    """Move a ``finalizing`` batch to its final status and save ``rows`` (its output files, its
    webhook event) in one transaction; False, with nothing saved, when another scheduler
    finished it first."""
    changed = rows_changed(
        session,
        update(Batch)
        .execution_options(**NO_SYNC)
        .where(Batch.id == batch_id, Batch.status == BatchStatus.FINALIZING)
        .values(status=new, **values),
    )
    if not changed:
        session.rollback()
        return False
    session.add_all(rows)
    session.commit()
    return True


def cancel_queued_batch_jobs(session: Session, batch_id: str, *, error: str) -> list[QueueEntry]:
    """Queued jobs of a batch to cancelled; returns them for their Redis entries to go too."""
    now = utcnow()
    rows = session.execute(
        update(Job)
        .execution_options(**NO_SYNC)
        .where(Job.batch_id == batch_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, error=error, finished_at=now, cancel_requested_at=now)
        .returning(*QUEUE_ENTRY_COLUMNS)
    ).all()
    session.commit()
    return [queue_entry(r) for r in rows]


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
