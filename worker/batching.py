"""The worker's continuous-batching loop: many generations of one model decoded together.

RQ's loop hands the worker one job at a time. When that job is a generation, the worker
stays here until the model has no live sequence left: each turn it takes further waiting
jobs for the same model while slots are free (without blocking, in priority order), runs
one decoder step for all of them, and settles the sequences that ended. Every job keeps
exactly what a job run alone has: its SQL claim, its own RQ execution and registry entry
(so ``rq info`` is true), heartbeats, cancellation, a deadline, and its outcome through the
writer.

Priorities stay intact because admission reads the worker's own ordered queue list (every
``high`` queue, then ``normal``, then ``low``; loaded models first within each): the run
admits from the first non-empty queue only if it is this model's, and stops admitting as
soon as a queue ahead of it, another model's, has a job waiting. The live sequences then
finish, RQ's loop takes that job next, and no ``high`` job waits behind the admission of a
``low`` one. A drained worker, or one told to stop (SIGTERM, RQ's warm shutdown), admits
nothing more and lets the live sequences finish.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from redis.exceptions import RedisError
from rq import Queue
from rq.executions import Execution
from rq.job import Job
from sqlalchemy.exc import SQLAlchemyError

from gpuq.db.tables import JobKind
from gpuq.jobs.queues import parse_queue_name
from gpuq.redis_keys import RUN_ALONE_KEY
from gpuq.store import ClaimedJob
from worker.decoder import DecodeError, Finished
from worker.engine import LoadedModel

if TYPE_CHECKING:
    from worker.worker import GpuqWorker

log = logging.getLogger(__name__)

INTAKE_POLL_S = 0.05  # with a slot free and nothing found, look at the queues again after this long


class GenerationRun:
    def __init__(self, worker: GpuqWorker, queue: Queue) -> None:
        self._worker = worker
        self._queue = queue
        self._model = parse_queue_name(queue.name)[0]
        self._jobs: dict[str, tuple[Job, Queue, Execution]] = {}
        self._loaded: LoadedModel | None = None
        self._polled_at = float("-inf")
        self._closed = False  # admits nothing more: a job that must run alone is running or waiting

    def run(self, job: Job) -> None:
        self._closed = must_run_alone(self._worker, job)
        self._admit(job, self._queue)
        try:
            while self._loaded is not None and self._loaded.decoder is not None and self._loaded.decoder.active:
                self._take_more(self._loaded.decoder.free_slots)
                try:
                    finished = self._loaded.decoder.step()
                except DecodeError as exc:
                    self._fail_all(exc)
                    break
                self._worker.runner.publish_pieces(self._loaded.decoder.take_pieces(), ended=bool(finished))
                for done in finished:
                    self._settle(done)
        finally:
            self._worker.runner.keep_models()

    # ------------------------------------------------------------- intake

    def _take_more(self, free: int) -> None:
        """Admits waiting jobs of this model into free slots, while they are the most urgent."""
        if free <= 0 or self._closed or time.monotonic() - self._polled_at < INTAKE_POLL_S:
            return
        self._polled_at = time.monotonic()
        worker = self._worker
        worker._read_control()  # throttled to once a second unless pub/sub said it changed
        if worker._control.drained or worker._stop_requested:  # drained, or stopping (SIGTERM: finish, take no more)
            return
        if worker.runner.sql.wait_s > 0 or worker.redis_health.wait_s > 0:  # an outage: the live sequences go on
            return
        try:
            self._admit_waiting(free)
        except RedisError as exc:  # the live sequences go on; intake resumes once Redis answers
            worker.redis_health.failed("taking more jobs", exc)

    def _admit_waiting(self, free: int) -> None:
        worker = self._worker
        while free > 0:
            taken = next_waiting(worker, self._model, JobKind.GENERATE)
            if taken is None:
                return
            if taken[0].id in self._jobs or must_run_alone(worker, taken[0]):
                # An admin requeued a job still running here (its old run ends at the next
                # step), or the job must run alone: it waits in front until this run ends.
                taken[1].push_job_id(taken[0].id, at_front=True)
                self._closed = taken[0].id not in self._jobs
                return
            if self._admit(*taken):
                free -= 1
            self._polled_at = float("-inf")  # a job came: look again at once while slots are free

    def _admit(self, job: Job, queue: Queue) -> bool:
        worker = self._worker
        started = start_job(worker, job, queue)
        if started is None:
            return False
        execution, cancel, claimed = started
        try:
            deadline = time.monotonic() + worker.job_timeout_s
            loaded = worker.runner.admit_generation(claimed, cancel, deadline)
        except Exception:
            log.exception("job %s could not be started", job.id)
            worker.fail_execution(job, queue, execution)
            return False
        if loaded is None:  # it ended at once (failed, handed back)
            worker.end_execution(job, execution)
            return False
        log.info("%s: %s (%d running)", queue.name, job.id, len(self._jobs) + 1)
        self._loaded = loaded
        self._jobs[job.id] = (job, queue, execution)
        return True

    # ------------------------------------------------------------- endings

    def _settle(self, finished: Finished) -> None:
        job, _queue, execution = self._jobs.pop(finished.key)
        self._worker.runner.finish_generation(finished)
        self._worker.end_execution(job, execution)

    def _fail_all(self, exc: DecodeError) -> None:
        """llama_decode failed outright: every live sequence fails with the error, and the
        model is unloaded so the next job gets a fresh context."""
        log.error("decoding failed with %d sequences live: %s", len(self._jobs), exc)
        for job_id in list(self._jobs):
            self._settle(Finished(job_id, error=f"{type(exc).__name__}: {exc}"))
        self._worker.runner.unload(self._model)
        self._loaded = None


class EmbeddingRun:
    """Several queued embedding jobs of one model, their texts embedded together.

    Taken the way a generation run admits (the first non-empty queue in the worker's order
    must be this model's embedding queue), so priorities hold; each job keeps its claim, RQ
    execution and outcome."""

    MAX_JOBS = 32  # a batch's job holds up to 64 texts: at most ~2,000 texts in one run

    def __init__(self, worker: GpuqWorker, queue: Queue) -> None:
        self._worker = worker
        self._queue = queue
        self._model = parse_queue_name(queue.name)[0]

    def run(self, job: Job) -> None:
        worker = self._worker
        started = self._start(self._take_waiting(job))
        if not started:
            return
        if len(started) > 1:
            log.info("embedding %d jobs of %s together", len(started), self._model)
        worker.runner.run_embeddings([(claimed, cancel) for _job, _execution, claimed, cancel in started])
        for each, execution, _claimed, _cancel in started:
            worker.end_execution(each, execution)

    def _take_waiting(self, job: Job) -> list[tuple[Job, Queue]]:
        """The job, and the waiting jobs of its model next in the worker's order."""
        worker = self._worker
        taken = [(job, self._queue)]
        worker._read_control()
        alone = must_run_alone(worker, job)
        stopping = worker._control.drained or worker._stop_requested  # SIGTERM: finish, take no more
        while not alone and not stopping and len(taken) < self.MAX_JOBS:
            try:
                more = next_waiting(worker, self._model, JobKind.EMBED)
            except RedisError as exc:
                worker.redis_health.failed("taking more embedding jobs", exc)
                break
            if more is None:
                break
            if must_run_alone(worker, more[0]):  # it runs next, by itself
                more[1].push_job_id(more[0].id, at_front=True)
                break
            taken.append(more)
        return taken

    def _start(self, taken: list[tuple[Job, Queue]]) -> list[tuple[Job, Execution, ClaimedJob, threading.Event]]:
        """Each taken job claimed and started; if the database goes away meanwhile, those not
        started yet go back to the front of their queues, in their order."""
        worker = self._worker
        started = []
        for i, (each, queue) in enumerate(taken):
            if worker.runner.sql.wait_s > 0:
                for back, back_queue in reversed(taken[i:]):
                    back_queue.push_job_id(back.id, at_front=True)
                break
            begun = start_job(worker, each, queue)
            if begun is not None:
                execution, cancel, claimed = begun
                started.append((each, execution, claimed, cancel))
        return started


def next_waiting(worker: GpuqWorker, model: str, kind: str) -> tuple[Job, Queue] | None:
    """The job at the front of the first non-empty queue of the worker's ordered list, if that
    queue is ``model``'s for ``kind``; None when nothing waits or something more urgent does."""
    queues = worker._ordered_queues
    with worker.connection.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue.key)
        lengths = pipe.execute()
    for queue, length in zip(queues, lengths, strict=True):
        if not length:
            continue
        queue_model, queue_kind, _priority = parse_queue_name(queue.name)
        if queue_model != model or queue_kind != kind:
            return None  # a job ahead of ours in the worker's order: let this run end
        return Queue.dequeue_any(
            [queue],
            None,  # no timeout: a plain LPOP, never blocking the live sequences
            connection=worker.connection,
            job_class=worker.job_class,
            serializer=worker.serializer,
        )
    return None


def must_run_alone(worker: GpuqWorker, job: Job) -> bool:
    """Whether the job died beside others on a worker that crashed (see the reconciler);
    not known while Redis does not answer, when it runs as any other."""
    try:
        return bool(worker.connection.sismember(RUN_ALONE_KEY, job.id))
    except RedisError:
        return False


def start_job(worker: GpuqWorker, job: Job, queue: Queue) -> tuple[Execution, threading.Event, ClaimedJob] | None:
    """RQ's execution, the monitor's watch and the SQL claim of a job taken from its queue;
    None when it is not to run (not queued any more in SQL, or SQL unreachable)."""
    if job.id in worker._requeued_jobs:
        # An admin requeued it while it ran here: its stopped run's outcome must be written
        # (and discarded) before this claim, or it would match the new run.
        worker._requeued_jobs.discard(job.id)
        worker._flush_outcomes()
    try:
        execution = worker.begin_execution(job)
    except RedisError as exc:
        # Popped but not started: in no list, its hash still queued, so the reconciler
        # enqueues it again (see IN_FLIGHT_LIMIT_S). Nothing was claimed.
        worker.redis_health.failed(f"starting {job.id}", exc)
        return None
    cancel = worker.monitor.begin(job.id)
    try:
        claimed = worker.runner.claim(job.id)
    except SQLAlchemyError:  # nothing ran: the job goes back to the front of its queue
        worker.return_unclaimed(job, queue, execution)
        return None
    except Exception:
        # Infrastructure (SQL unreachable while claiming, say): the row is still queued,
        # RQ's failed registry keeps the trace and the reconciler enqueues the job again.
        log.exception("job %s could not be started", job.id)
        worker.fail_execution(job, queue, execution)
        return None
    if claimed is None:
        worker.end_execution(job, execution)
        return None
    with suppress(RedisError):  # else it runs alone once more, which is harmless
        worker.connection.srem(RUN_ALONE_KEY, job.id)  # running now (alone if it had to)
    return execution, cancel, claimed
