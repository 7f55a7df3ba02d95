"""Batches: an input file's lines run as ordinary jobs, then collected into output files.

* **Create**: every line is checked before anything is written (its endpoint, body, model,
  kind, context, placement); errors name their line numbers. Unlike OpenAI, a file may
  mix endpoints (chat, completions, embeddings): each line is answered in its own
  endpoint's format, and the batch's ``endpoint`` is just the first line's kind of work. The batch row and all its
  jobs go into SQL in one transaction, then into Redis in one pipeline (undone if Redis
  fails). Embedding lines are grouped per model, up to ``EMBED_GROUP_TEXTS`` texts a
  job, so llama.cpp embeds a group in one call instead of one call per line.
* **Progress** is counted from the jobs' statuses, per input line.
* **Advance** (the scheduler, every tick): a batch whose jobs are all final is
  finalised (claimed as ``finalizing``, output and error files written, status
  ``completed``, ``cancelled`` or ``expired``); a batch past its completion window has its
  queued jobs cancelled and ends ``expired``. Finalisation is resumable: a batch found
  ``finalizing`` (its files could not be written, or its scheduler died) is finalised
  again, its files rewritten under the same ids. Status changes are conditional, so
  several schedulers finalise a batch once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches import anthropic_format, message_batches
from gpuq.batches.files import PURPOSE_BATCH, PURPOSE_OUTPUT, files_dir, jsonl_line, read_lines
from gpuq.batches.gc_pause import gc_paused
from gpuq.batches.openai_format import EMBEDDINGS, ENDPOINTS, parse_body, response_body
from gpuq.batches.queue_order import HeldStarts, Planning, QueueOrder
from gpuq.batches.window import window_seconds
from gpuq.db.tables import FINAL_STATUSES, Batch, BatchStatus, File, Job, JobKind, JobStatus, Model, utcnow
from gpuq.errors import RequestError, queue_unavailable
from gpuq.fleet.sample_limit import SampleLimit
from gpuq.fleet.snapshot import Fleet, load_fleet
from gpuq.fleet.workers import LiveWorker, live_workers
from gpuq.jobs import admission
from gpuq.jobs.cancel import signal_worker
from gpuq.jobs.enqueue import enqueue_jobs, remove_queued
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prefix_routing import PrefixRouting, holders, request_chain
from gpuq.jobs.request import EmbeddingParams, JobParams
from gpuq.jobs.submit import JobSpec, check_against_model, check_placeable, check_samples
from gpuq.private_files import open_private
from gpuq.queue_names import Priority, QueueEntry
from gpuq.stats import metrics
from gpuq.store.webhooks import new_delivery

log = logging.getLogger(__name__)

EMBED_GROUP_TEXTS = 64
MAX_ERRORS_REPORTED = 20
ACTIVE = (BatchStatus.IN_PROGRESS.value, BatchStatus.CANCELLING.value)
EXPIRED_ERROR = "the batch expired before this request ran"
# What each line's endpoint runs: OpenAI's, and Anthropic's Messages (a Message Batch's lines).
KINDS = {**ENDPOINTS, anthropic_format.MESSAGES: JobKind.GENERATE}


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def completion_window_s(window: str) -> int:
    try:
        return window_seconds(window)
    except ValueError as exc:
        raise RequestError(422, f"completion_window {exc}", param="completion_window") from None


# ---------------------------------------------------------------- planning jobs from lines


@dataclass
class _Line:
    number: int
    custom_id: str
    endpoint: str
    model: str
    params: JobParams

    @property
    def kind(self) -> JobKind:
        return KINDS[self.endpoint]

    @property
    def inputs(self) -> list[str | list[int]]:
        """An embedding line's inputs."""
        assert isinstance(self.params, EmbeddingParams), "an embedding line"
        return self.params.input


def _parse(endpoint: str, body: Any) -> tuple[str, JobParams]:
    """(model, request) of a line's body, read as its endpoint's format."""
    if endpoint == anthropic_format.MESSAGES:
        return anthropic_format.parse_params(body)
    return parse_body(endpoint, body)


def _lines(path: str, registered_name: Callable[[str], str]) -> Iterator[_Line | tuple[int, str]]:
    """The file's lines one at a time, each as a ``_Line`` (its model named as registered:
    an alias's lines become its model's jobs) or (number, what is wrong with it)."""
    for number, raw in read_lines(path):
        endpoint = raw["url"]  # checked at upload
        try:
            model, params = _parse(endpoint, raw["body"])
        except ValueError as exc:
            yield number, str(exc)
            continue
        params = params.model_copy(update={"endpoint": endpoint})
        yield _Line(number, raw["custom_id"], endpoint, registered_name(model), params)


def _check_line(line: _Line, model: Model | None, fleet: Fleet, samples: SampleLimit | None) -> int | None:
    """The line's prompt tokens (None when it surely fits, or is no generation); RequestError if it cannot run.
    Only the count is kept (the ids of 50,000 lines would be the memory a batch's start must
    not hold): the worker tokenises a batch line's prompt."""
    spec = JobSpec(line.kind, line.model, Priority.LOW, line.params)
    counted = check_against_model(spec, model, exact=False)
    check_placeable(spec, model, fleet)
    if samples is not None:
        check_samples(spec, samples)
    return None if counted is None else counted.tokens


@dataclass
class BatchPlan:
    """What checking a file's lines found, enough to write its jobs in a second reading of
    the file: the lines themselves are not kept (50,000 lines of 4 KB are 200 MB of text,
    and then as much again as the jobs' rows), so the API's memory stays near its baseline."""

    path: str
    batch_id: str
    priority: int
    owner: str | None
    api_key_id: str | None
    line_count: int  # the valid lines: at most one job each
    tokens: dict[int, int]  # line number -> its prompt's tokens, where they were counted
    names: dict[str, str]  # a model name the lines use -> the registered model's (an alias differs)
    on_gpu: bool  # the fleet has GPUs (workers' default slots differ)

    def jobs(self, order: QueueOrder | None = None) -> Iterator[store.NewJob]:
        """The jobs, the file read again line by line: a line's job as soon as it is whole
        (embedding lines of one model gathered, in input order, up to EMBED_GROUP_TEXTS texts).
        With ``order``, each generation line is noted for the queue order's plan."""
        ids = iter(store.new_job_ids(self.line_count))
        gathering: dict[str, list[_Line]] = {}  # model -> its embedding lines not yet in a job
        for line in _lines(self.path, lambda name: self.names.get(name, name)):
            assert isinstance(line, _Line), "a line refused when it was checked"
            if order is not None and isinstance(line.params, GenerationParams):
                order.note(line.model, line.number, line.params)
            if line.kind != JobKind.EMBED:
                yield self._job(next(ids), line.kind, line.params, line, 1, line.custom_id)
                continue
            group = gathering.setdefault(line.model, [])
            if group and sum(len(g.inputs) for g in group) + len(line.inputs) > EMBED_GROUP_TEXTS:
                yield self._embedding_job(next(ids), group)
                group = gathering[line.model] = []
            group.append(line)
        for group in gathering.values():
            if group:
                yield self._embedding_job(next(ids), group)

    def _embedding_job(self, job_id: str, group: list[_Line]) -> store.NewJob:
        params = EmbeddingParams(
            input=[text for line in group for text in line.inputs],
            custom_ids=[line.custom_id for line in group],
            input_counts=[len(line.inputs) for line in group],
            endpoint=EMBEDDINGS,
        )
        single = group[0].custom_id if len(group) == 1 else None
        return self._job(job_id, JobKind.EMBED, params, group[0], len(group), single)

    def _job(
        self, job_id: str, kind: JobKind, params: JobParams, first: _Line, count: int, custom_id: str | None
    ) -> store.NewJob:
        return store.NewJob(
            id=job_id,
            kind=kind.value,
            model=first.model,
            priority=self.priority,
            request=params.stored(),
            request_hash="",  # batch lines have no idempotency keys to compare against
            prompt_tokens=self.tokens.get(first.number),
            batch_id=self.batch_id,
            custom_id=custom_id,
            line_count=count,
            line_number=first.number,
            owner=self.owner,
            api_key_id=self.api_key_id,
        )


def plan_batch_jobs(
    session: Session,
    *,
    path: str,
    batch_id: str,
    priority: int,
    owner: str | None = None,
    api_key_id: str | None = None,
    workers: list[LiveWorker] | None = None,
    worker_slots: int = 0,
) -> BatchPlan:
    """Every line checked, one at a time; RequestError(422) lists the bad lines. The plan's
    ``jobs()`` then turns the lines into jobs. With the live ``workers``, a generation's
    samples are checked against their slots (``worker_slots``: ``GPUQ_WORKER_SLOTS``, the
    limit where none serves the model); without, they are not (a schedule's dry run: its
    batch runs later, on the fleet of then)."""
    models: dict[str, Model | None] = {}
    fleet = load_fleet(session)
    samples = None if workers is None else SampleLimit.of(workers, worker_slots=worker_slots, has_gpus=bool(fleet.gpus))
    valid = 0
    tokens: dict[int, int] = {}
    errors: list[tuple[int, str]] = []

    def registered_name(name: str) -> str:
        if name not in models:
            models[name] = found = store.find_model(session, name)
            if found is not None:
                models[found.name] = found
        found = models[name]
        return name if found is None else found.name

    for line in _lines(path, registered_name):
        if not isinstance(line, _Line):
            errors.append(line)
            continue
        try:
            counted = _check_line(line, models[line.model], fleet, samples)
        except RequestError as exc:
            errors.append((line.number, exc.message))
            continue
        valid += 1
        if counted is not None:
            tokens[line.number] = counted
    if errors:
        errors.sort()
        shown = "; ".join(f"line {number}: {message}" for number, message in errors[:MAX_ERRORS_REPORTED])
        rest = len(errors) - MAX_ERRORS_REPORTED
        raise RequestError(422, f"{len(errors)} invalid lines: {shown}" + (f"; and {rest} more" if rest > 0 else ""))
    names = {name: model.name for name, model in models.items() if model is not None}
    return BatchPlan(path, batch_id, priority, owner, api_key_id, valid, tokens, names, bool(fleet.gpus))


# ---------------------------------------------------------------- creating and cancelling


def start_batch(
    session: Session,
    redis: Redis,
    *,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: dict[str, str] | None,
    priority: int,
    timeout_s: int,
    webhook_url: str | None = None,
    owner: str | None = None,
    api_key_id: str | None = None,
    admit: Callable[[Session], None] | None = None,
    worker_slots: int = 0,
    planning: Planning | None = None,
) -> Batch:
    """Check every line, then write the batch and its jobs and queue them (or nothing).
    The batch and its jobs belong to ``owner``; ``api_key_id`` is the key that asked, whose
    queued-jobs limit they count against; ``admit`` applies that key's limits in ``session``,
    once every line has passed its checks (a refused batch spends nothing); ``worker_slots``
    is ``GPUQ_WORKER_SLOTS`` (gpuq/fleet/sample_limit.py). Generation lines are queued in the
    order ``planning`` plans (``gpuq.batches.queue_order``; None: its defaults), the rest in
    file order. Synchronous: the API runs it in a worker thread, the scheduler in its own loop."""
    file, window_s = _checked_request(session, input_file_id, endpoint, completion_window)
    try:
        workers = live_workers(redis)
    except RedisError as exc:
        raise queue_unavailable(exc) from None
    with gc_paused():
        batch_id = message_batches.new_id() if endpoint == anthropic_format.MESSAGES else new_batch_id()
        plan = plan_batch_jobs(
            session,
            path=file.path,
            batch_id=batch_id,
            priority=priority,
            owner=owner,
            api_key_id=api_key_id,
            workers=workers,
            worker_slots=worker_slots,
        )
        if admit is not None:
            admit(session)
        batch = _new_batch_row(
            batch_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            window_s=window_s,
            priority=priority,
            metadata=metadata,
            total=file.line_count,
            webhook_url=webhook_url,
            owner=owner,
        )
        queued: list[tuple[int, QueueEntry]] = []  # small: what Redis needs, by input line
        # Its lines are needed by its expiry: a batch the fleet cannot finish by then is refused.
        work = admission.Tally(Priority(priority), owner, batch.expires_at)
        planning = planning or Planning()
        order = QueueOrder(planning, on_gpu=plan.on_gpu) if planning.enabled else None
        entries: list[QueueEntry] = []

        def noted(jobs: Iterator[store.NewJob]) -> Iterator[store.NewJob]:
            for j in jobs:
                entry = QueueEntry(j.id, j.model, j.kind, j.priority, j.owner, batch.expires_at)
                queued.append((j.line_number or 0, entry))
                work.add(j)
                yield j

        def before_commit() -> None:
            work.refuse_if_late(session, redis)
            # Every job is made, so the plan is whole: its figures go into the batch's row in
            # the commit that inserts the jobs.
            held = _held_starts(session, redis, owner, planning.routing) if planning.routing.on else None
            entries.extend(_queue_order(batch, queued, order, workers, held))

        store.insert_batch(session, batch, noted(plan.jobs(order)), before_commit=before_commit)
        _enqueue_or_delete(session, redis, batch_id, entries, timeout_s=timeout_s)
        return batch


def _enqueue_or_delete(
    session: Session, redis: Redis, batch_id: str, entries: list[QueueEntry], *, timeout_s: int
) -> None:
    """The batch's jobs into their queues; when Redis does not take them, the batch and its
    jobs are deleted again (nothing half made) and the caller gets a 503."""
    try:
        enqueue_jobs(redis, entries, timeout_s=timeout_s)
    except RedisError as exc:
        store.delete_batch(session, batch_id)
        raise queue_unavailable(exc) from None


def _new_batch_row(
    batch_id: str,
    *,
    endpoint: str,
    input_file_id: str,
    completion_window: str,
    window_s: int,
    priority: int,
    metadata: dict[str, str] | None,
    total: int,
    webhook_url: str | None,
    owner: str | None,
) -> Batch:
    """The batch's row, in progress from now and expiring after its window."""
    now = utcnow()
    return Batch(
        id=batch_id,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        status=BatchStatus.IN_PROGRESS.value,
        priority=priority,
        batch_metadata=metadata,
        total=total,
        created_at=now,
        in_progress_at=now,
        expires_at=now + timedelta(seconds=window_s),
        webhook_url=webhook_url,
        owner=owner,
    )


def _checked_request(session: Session, input_file_id: str, endpoint: str, completion_window: str) -> tuple[File, int]:
    """The batch's input file, checked, and its completion window in seconds; RequestError
    for an endpoint gpuq does not run, a window it does not know, a file missing or unfit."""
    if endpoint not in KINDS:
        raise RequestError(
            422, f"endpoint {endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}", param="endpoint"
        )
    window_s = completion_window_s(completion_window)
    file = store.get_file(session, input_file_id)
    if file is None:
        raise RequestError(404, f"file {input_file_id!r} does not exist")
    check_input_file(file)
    return file, window_s


def _held_starts(session: Session, redis: Redis, owner: str | None, routing: PrefixRouting) -> HeldStarts:
    """Which workers hold the starts of a batch's groups of lines: each group's first line
    tokenised as the API tokenises a single request, its chain looked up in the workers' prefix
    index. A Redis that does not answer places the groups by load (the enqueue then says so)."""

    def held(model_name: str, requests: list[GenerationParams | None], workers: list[str]) -> list[str | None]:
        model = store.find_model(session, model_name)
        chains = [
            None if r is None or model is None else request_chain(model.path, owner, r, routing) for r in requests
        ]
        try:
            return holders(redis, chains, workers, routing.min_blocks)
        except RedisError:
            return [None] * len(requests)

    return held


def _queue_order(
    batch: Batch,
    queued: list[tuple[int, QueueEntry]],
    order: QueueOrder | None,
    workers: list[LiveWorker],
    held: HeldStarts | None = None,
) -> list[QueueEntry]:
    """The batch's queue entries in the order planned (file order without a plan), the plan's
    figures written on its row."""
    if order is None:
        return [entry for _line, entry in sorted(queued, key=lambda q: q[0])]
    entries, figures = order.order(queued, workers, held)
    if figures is not None:
        batch.planned_lines, batch.planned_groups, batch.planned_slots = figures.lines, figures.groups, figures.slots
        log.info(
            "batch %s: %d generation lines planned into %d groups for %d slots; "
            "%d of their %d prompt bytes are in starts shared with other lines",
            batch.id,
            figures.lines,
            figures.groups,
            figures.slots,
            figures.shared_bytes,
            figures.prompt_bytes,
        )
    return entries


def check_input_file(file: File) -> None:
    """A batch runs an uploaded batch file, not another batch's output."""
    if file.purpose != PURPOSE_BATCH:
        raise RequestError(
            422,
            f"file {file.id} has purpose {file.purpose!r}; a batch needs a file with purpose 'batch'",
            param="input_file_id",
        )


def cancel_batch(session: Session, redis: Redis, batch_id: str) -> Batch:
    """Queued jobs are cancelled at once, running ones at their next token; the batch is
    ``cancelling`` until they have stopped, then the scheduler makes it ``cancelled``."""
    batch = store.get_batch(session, batch_id)
    if batch is None:
        raise RequestError(404, f"batch {batch_id!r} does not exist")
    if batch.status not in ACTIVE:
        raise RequestError(409, f"batch {batch_id} is {batch.status}; only a batch in progress can be cancelled")
    store.set_batch_status(session, batch_id, old=ACTIVE, new=BatchStatus.CANCELLING.value, cancelling_at=utcnow())
    _stop_jobs(session, redis, batch_id, error="the batch was cancelled")
    session.expire_all()
    session.refresh(batch)  # its status and counts as the calls above left them
    return batch


def _stop_jobs(session: Session, redis: Redis, batch_id: str, *, error: str) -> None:
    cancelled = store.cancel_queued_batch_jobs(session, batch_id, error=error)
    if cancelled:
        remove_queued(redis, cancelled)
        metrics.record_finished_jobs(
            redis, [metrics.FinishedJob(e.model, e.kind, JobStatus.CANCELLED.value) for e in cancelled]
        )
    store.mark_batch_cancel_requested(session, batch_id)
    for job_id, worker in store.running_batch_jobs(session, batch_id):
        signal_worker(redis, job_id, worker)


# ---------------------------------------------------------------- progress and results


def request_counts(session: Session, batch: Batch) -> dict[str, int]:
    by_status = store.batch_line_counts(session, batch.id)
    return {
        "total": batch.total,
        "completed": by_status.get(JobStatus.SUCCEEDED, 0),
        "failed": by_status.get(JobStatus.FAILED, 0) + by_status.get(JobStatus.CANCELLED, 0),
    }


def result_lines(session: Session, batch: Batch) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(succeeded, output line) per input line answered so far, in input order: OpenAI's
    lines, or a Message Batch's results."""
    if message_batches.is_message_batch(batch):
        yield from message_batches.result_lines(session, batch)
        return
    for job in store.batch_jobs(session, batch.id):
        if job.status not in FINAL_STATUSES:
            continue
        custom_ids = job.request.get("custom_ids") or [job.custom_id]
        endpoint = job.request.get("endpoint", batch.endpoint)
        shares = _split_vectors(job) if endpoint == EMBEDDINGS else [None] * len(custom_ids)
        for i, (custom_id, vectors) in enumerate(zip(custom_ids, shares, strict=True)):
            line_id = f"batch_req_{job.id}" + (f"_{i}" if len(custom_ids) > 1 else "")
            if job.status == JobStatus.SUCCEEDED:
                body = response_body(endpoint, job, vectors=vectors)
                response = {"status_code": 200, "request_id": job.id, "body": body}
                yield True, {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
            else:
                yield False, {"id": line_id, "custom_id": custom_id, "response": None, "error": _error_of(job)}


def _split_vectors(job: Job) -> list[list[list[float]] | None]:
    counts = job.request.get("input_counts") or [len(job.request.get("input", []))]
    vectors = (job.result or {}).get("embeddings")
    if vectors is None:
        return [None] * len(counts)
    shares, start = [], 0
    for n in counts:
        shares.append(vectors[start : start + n])
        start += n
    return shares


def _error_of(job: Job) -> dict[str, str]:
    if job.status == JobStatus.CANCELLED:
        expired = (job.error or "").startswith(EXPIRED_ERROR)
        return {"code": "batch_expired" if expired else "batch_cancelled", "message": job.error or "cancelled"}
    return {"code": "server_error", "message": job.error or "the job failed"}


def _output_file_id(batch_id: str, name: str) -> str:
    """The id of a batch's output or error file: derived from the batch, so a finalisation
    that is done again writes the same files instead of new ones beside them."""
    return "file-" + hashlib.sha256(f"{batch_id}/{name}".encode()).hexdigest()[:24]


def _write_output_files(session: Session, batch: Batch, directory: Path) -> dict[str, File]:
    """The output and error files on disk (only those with lines), each written to a private
    temporary name then renamed over its final path, so a reader, a failed earlier attempt
    or a second scheduler writing the same bytes never leaves a partial file. Returns their
    rows by name (``output``, ``errors``), not yet saved."""
    token = secrets.token_hex(4)
    partial = {True: directory / f".{batch.id}.{token}.out", False: directory / f".{batch.id}.{token}.err"}
    counts = {True: [0, 0], False: [0, 0]}  # lines, bytes
    try:
        with (
            open_private(partial[True], exclusive=True) as ok_out,
            open_private(partial[False], exclusive=True) as err_out,
        ):
            for succeeded, line in result_lines(session, batch):
                data = jsonl_line(line)
                (ok_out if succeeded else err_out).write(data)
                counts[succeeded][0] += 1
                counts[succeeded][1] += len(data)
        files = {}
        for succeeded, name in ((True, "output"), (False, "errors")):
            lines, size = counts[succeeded]
            if lines == 0:
                continue
            file_id = _output_file_id(batch.id, name)
            final = directory / f"{file_id}.jsonl"
            os.replace(partial[succeeded], final)
            files[name] = File(
                id=file_id,
                purpose=PURPOSE_OUTPUT,
                filename=f"{batch.id}_{name}.jsonl",
                bytes=size,
                line_count=lines,
                path=str(final),
                owner=batch.owner,  # the batch's tenant may download its results
                created_at=utcnow(),
            )
        return files
    finally:
        for path in partial.values():
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------- the scheduler's part


def advance_batches(session: Session, redis: Redis, data_dir: Path) -> list[str]:
    """Expire what is past its window, finalise what has finished, and finish what an earlier
    pass claimed but did not finalise (its files could not be written, or its process died);
    returns the batch ids finalised. A batch that fails does not hold up the others: its
    error is raised once they have all been seen to."""
    finished: list[str] = []
    errors: list[Exception] = []
    for batch in store.batches_with_status(session, [*ACTIVE, BatchStatus.FINALIZING.value]):
        try:
            if _advance(session, redis, batch, data_dir):
                finished.append(batch.id)
        except Exception as exc:
            session.rollback()
            exc.add_note(f"while advancing batch {batch.id}")
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup(f"{len(errors)} batches could not be advanced", errors)
    return finished


def _advance(session: Session, redis: Redis, batch: Batch, data_dir: Path) -> bool:
    if batch.status == BatchStatus.FINALIZING:
        # Claimed by a pass that stopped short (its files could not be written, or it died).
        return _finish(session, batch, data_dir, claimed_at=batch.finalizing_at or utcnow())
    if batch.status == BatchStatus.IN_PROGRESS and utcnow() >= batch.expires_at:
        _stop_jobs(session, redis, batch.id, error=EXPIRED_ERROR)
    return _pending_lines(session, batch.id) == 0 and _finalize(session, batch, data_dir)


def _pending_lines(session: Session, batch_id: str) -> int:
    return sum(n for status, n in store.batch_line_counts(session, batch_id).items() if status not in FINAL_STATUSES)


def _finalize(session: Session, batch: Batch, data_dir: Path) -> bool:
    """Claim a batch whose lines are all final (``finalizing``: no retry can start now), then finish it."""
    claimed_at = utcnow()
    if not store.set_batch_status(
        session, batch.id, old=ACTIVE, new=BatchStatus.FINALIZING.value, finalizing_at=claimed_at
    ):
        return False  # another scheduler has it
    return _finish(session, batch, data_dir, claimed_at=claimed_at)


def _finish(session: Session, batch: Batch, data_dir: Path, *, claimed_at: datetime) -> bool:
    """Write the output files of a ``finalizing`` batch and give it its final status.

    Safe to do again after a failure or a crash at any point, and in two schedulers at once:
    the files have ids derived from the batch and are replaced whole with the same bytes (the
    lines are final), and their rows, the final status and the webhook event are one
    transaction that only the scheduler moving the batch out of ``finalizing`` commits."""
    if _pending_lines(session, batch.id):
        # An admin retried a line between the count and the claim (retries need the batch
        # in progress, so none can start now): back to where it was, finalised once it ran.
        store.set_batch_status(
            session, batch.id, old=[BatchStatus.FINALIZING.value], new=_status_before(batch), finalizing_at=None
        )
        return False
    files = _write_output_files(session, batch, files_dir(data_dir))
    output = files["output"].id if "output" in files else None
    errors = files["errors"].id if "errors" in files else None
    final, stamp = _final_status(batch, claimed_at)
    rows: list[object] = list(files.values())
    if batch.webhook_url:
        counts = request_counts(session, batch)
        event = {
            "batch_id": batch.id,
            "status": final.value,
            "request_counts": counts,
            "output_file_id": output,
            "error_file_id": errors,
        }
        rows.append(
            new_delivery(f"batch.{final.value}", batch.webhook_url, event, batch_id=batch.id, owner=batch.owner)
        )
    if not store.finish_batch(
        session, batch.id, new=final.value, rows=rows, output_file_id=output, error_file_id=errors, **stamp
    ):
        return False  # another scheduler finished it first, with the same files
    log.info("batch %s %s", batch.id, final.value)
    return True


def _status_before(batch: Batch) -> str:
    """The status a batch had before it was claimed for finalisation (cancelling sets ``cancelling_at``)."""
    return BatchStatus.CANCELLING.value if batch.cancelling_at else BatchStatus.IN_PROGRESS.value


def _final_status(batch: Batch, claimed_at: datetime) -> tuple[BatchStatus, dict[str, datetime]]:
    """Decided by the time of the claim, not of this pass, so finishing again decides the same."""
    now = utcnow()
    if batch.cancelling_at:
        return BatchStatus.CANCELLED, {"cancelled_at": now}
    if claimed_at >= batch.expires_at:
        return BatchStatus.EXPIRED, {"expired_at": now}
    return BatchStatus.COMPLETED, {"completed_at": now}


def results_so_far(session: Session, batch: Batch) -> Iterator[bytes]:
    """The output lines answered so far, as JSONL, while the batch may still be running."""
    for _succeeded, line in result_lines(session, batch):
        yield jsonl_line(line)
