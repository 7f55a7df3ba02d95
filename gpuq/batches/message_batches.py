"""Anthropic's Message Batches on gpuq's batch engine.

A Message Batch is an ordinary gpuq batch (gpuq/batches/service.py) whose endpoint is
``/v1/messages``; that column is what records its format, so its jobs, result lines and
listing are shaped as Anthropic's. Its inline ``requests`` are checked one by one (each
``custom_id`` unique and as Anthropic spells them, each ``params`` a Messages request), then
written as the batch's input file, a batch line each, as a schedule's inline requests are;
from there the batch starts as any other: every line checked against its model, context and
placement, its jobs written in one transaction and queued, at its priority, with its
webhook. A bad request refuses the whole batch, naming its index and custom_id, and
nothing is kept.

Its object is derived from the batch row and its jobs' statuses: ``processing_status``
(``in_progress``, ``canceling``, ``ended``), ``request_counts`` (a cancelled request counts
as ``expired`` when the batch expired, ``canceled`` otherwise), RFC 3339 times, and
``results_url`` once it has ended (gpuq serves the results answered so far before that too).
Deleting an ended batch deletes its jobs, its row and its files, as Anthropic deletes a
batch's results.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches.anthropic_format import MESSAGES, NAME, parse_params
from gpuq.batches.anthropic_messages import batch_result
from gpuq.batches.files import PURPOSE_BATCH, jsonl_line, new_file_id
from gpuq.db.tables import FINAL_STATUSES, Batch, BatchStatus, File, JobStatus, utcnow
from gpuq.errors import RequestError
from gpuq.json_checks import nul_location, nul_message
from gpuq.private_files import open_private

MAX_REQUESTS = 100_000  # Anthropic's limit on a Message Batch
MAX_ERRORS_REPORTED = 20
ID_PREFIX = "msgbatch_"
ENDED = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
DELETE_CHUNK_JOBS = 5_000


def new_id() -> str:
    return f"{ID_PREFIX}{secrets.token_hex(12)}"


def is_message_batch(batch: Batch) -> bool:
    return batch.endpoint == MESSAGES


def _problem(index: int, request: Any, seen: set[str]) -> str | None:
    """What is wrong with one of the inline requests, or None (its custom_id is then in ``seen``)."""
    if not isinstance(request, dict):
        return f"requests[{index}]: a request is an object with custom_id and params"
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not NAME.match(custom_id):
        return f"requests[{index}].custom_id: 1 to 64 letters, digits, _ or -"
    where = f"requests[{index}] (custom_id {custom_id!r})"
    if custom_id in seen:
        return f"{where}: custom_id is used twice; each must be unique"
    seen.add(custom_id)
    unknown = sorted(set(request) - {"custom_id", "params"})
    if unknown:
        return f"{where}.{unknown[0]}: Extra inputs are not permitted"
    nul = nul_location(request.get("params"), "params")
    if nul is not None:
        return f"{where}: {nul_message(f'`{nul}`')}"
    try:
        parse_params(request.get("params"))
    except ValueError as exc:
        return f"{where}: {exc}"
    return None


def store_requests(requests: Iterable[Any], directory: Path) -> File:
    """Checks the inline requests and writes them as a batch input file (its row not yet
    saved); a 400 naming the bad ones (their index and custom_id), with nothing left on disk."""
    file_id = new_file_id()
    path = directory / f"{file_id}.jsonl"
    errors: list[str] = []
    seen: set[str] = set()
    lines = size = 0
    try:
        with open_private(path, exclusive=True) as out:
            for index, request in enumerate(requests):
                problem = _problem(index, request, seen)
                if problem is not None:
                    errors.append(problem)
                    continue
                line = {"custom_id": request["custom_id"], "method": "POST", "url": MESSAGES, "body": request["params"]}
                data = jsonl_line(line)
                out.write(data)
                lines, size = lines + 1, size + len(data)
        if errors:
            shown = "; ".join(errors[:MAX_ERRORS_REPORTED])
            more = len(errors) - MAX_ERRORS_REPORTED
            raise RequestError(
                400, f"{len(errors)} invalid requests: {shown}" + (f"; and {more} more" if more > 0 else ""),
                param="requests",
            )  # fmt: skip
        if lines == 0:
            raise RequestError(400, "requests: give at least one request", param="requests")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return File(
        id=file_id,
        purpose=PURPOSE_BATCH,
        filename=f"{file_id}.jsonl",
        bytes=size,
        line_count=lines,
        path=str(path),
        created_at=utcnow(),
    )


def _expired(batch: Batch) -> bool:
    """Whether its cancelled requests were stopped by its expiry (not by a cancel)."""
    if batch.cancelling_at is not None:
        return False
    return batch.status == BatchStatus.EXPIRED or utcnow() >= batch.expires_at


def processing_status(batch: Batch) -> str:
    if batch.status in ENDED:
        return "ended"
    return "canceling" if batch.cancelling_at is not None else "in_progress"


def request_counts(session: Session, batch: Batch) -> dict[str, int]:
    by_status = store.batch_line_counts(session, batch.id)
    cancelled = by_status.get(JobStatus.CANCELLED, 0)
    expired = _expired(batch)
    return {
        "processing": sum(n for status, n in by_status.items() if status not in FINAL_STATUSES),
        "succeeded": by_status.get(JobStatus.SUCCEEDED, 0),
        "errored": by_status.get(JobStatus.FAILED, 0),
        "canceled": 0 if expired else cancelled,
        "expired": cancelled if expired else 0,
    }


def _time(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def ended_at(batch: Batch) -> datetime | None:
    if batch.status not in ENDED:
        return None
    return batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at


def batch_object(session: Session, batch: Batch, *, base_url: str) -> dict[str, Any]:
    """Anthropic's message_batch object; ``base_url``: where this API is reached, for ``results_url``."""
    status = processing_status(batch)
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": request_counts(session, batch),
        "created_at": _time(batch.created_at),
        "expires_at": _time(batch.expires_at),
        "ended_at": _time(ended_at(batch)),
        "cancel_initiated_at": _time(batch.cancelling_at),
        "archived_at": None,
        "results_url": f"{base_url.rstrip('/')}/v1/messages/batches/{batch.id}/results" if status == "ended" else None,
    }


def result_lines(session: Session, batch: Batch) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(succeeded, result line) per request answered so far, in input order."""
    expired = _expired(batch)
    for job in store.batch_jobs(session, batch.id):
        if job.status in FINAL_STATUSES:
            yield batch_result(job, job.custom_id or "", expired=expired)


def delete_message_batch(session: Session, batch: Batch) -> None:
    """An ended batch's jobs, row and files (rows first, then the bytes); a 409 while it runs."""
    if batch.status not in ENDED:
        raise RequestError(
            409,
            f"message batch {batch.id} is still {processing_status(batch)}: cancel it, and delete it once it has ended",
        )
    for path in store.delete_ended_batch(session, batch.id, chunk_jobs=DELETE_CHUNK_JOBS):
        Path(path).unlink(missing_ok=True)
