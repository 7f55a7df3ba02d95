"""What a run needs of its worker (``worker.batching.Host``): intake from the worker's queues,
and each job's SQL claim and RQ execution from its start to its end.

``GpuqWorker`` (worker/worker.py) keeps RQ's loop and the worker's own bookkeeping: the
order of its queues and the fair pick over them, its registration, the admin's flags and
commands, outages, heartbeats. It builds one ``RunHost`` and hands it to every run, and
reaches it for what it needs back: the executions of the jobs running now.

Threads. A run's engine (the worker's main thread) and its desk (a thread per run) call the
verbs; the monitor thread heartbeats the executions, and the main thread registers them
again when Redis lost them. Those executions (``_running``) are the one state more than one
thread touches here, and this object owns them, behind its lock. The worker's drain flags,
read by the desk through ``Worker.taking_jobs``, stay the worker's (its ``AdminControls``).
"""

from __future__ import annotations

import logging
import threading
import traceback
from contextlib import suppress
from typing import Any, Protocol

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError
from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.worker import WorkerStatus
from sqlalchemy.exc import SQLAlchemyError

from gpuq.jobs import fair
from gpuq.jobs.prefix_routing import count_stolen
from gpuq.queue_names import parse_queue_name
from gpuq.redis_keys import RUN_ALONE_KEY, SLOTS_BUSY_FIELD, rq_intermediate_key, rq_queue_key
from worker.batching import Started
from worker.monitor import JobMonitor
from worker.outages import Dependency
from worker.publishing import Publisher
from worker.runner import JobRunner

log = logging.getLogger(__name__)

# At the end of a job RQ's job hash is deleted (results live in SQL), unless an admin's
# requeue or the reconciler has meanwhile enqueued the job again: then the hash belongs
# to the new queue entry, and deleting it would make RQ skip that entry.
_DELETE_UNLESS_QUEUED = """
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Worker(Protocol):
    """What the run host needs of its RQ worker: RQ's own bookkeeping of a job's start and
    end, the queue order, whether it takes jobs, and where Redis's outages are recorded."""

    connection: Redis
    redis_health: Dependency

    @property
    def name(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def worker_ttl(self) -> int: ...

    def taking_jobs(self) -> bool:
        """Not drained, not stopping."""

    def picker(self) -> fair.Picker:
        """The fair pick over the worker's ordered bands."""

    def fetch(self, queue_name: str, job_id: str) -> tuple[Job, Queue] | None:
        """RQ's job for an id taken from a queue; None when its hash is gone."""

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None: ...

    def cleanup_execution(self, job: Job, pipeline: Pipeline, execution: Execution) -> None: ...

    def increment_successful_job_count(self, pipeline: Pipeline) -> None: ...

    def handle_job_failure(
        self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = "", execution: Any = None
    ) -> Any: ...

    @property
    def publisher(self) -> Publisher:
        """Its worker hash's models, and RQ bookkeeping kept through an outage."""


class RunHost:
    def __init__(
        self,
        worker: Worker,
        *,
        runner: JobRunner,
        monitor: JobMonitor,
        job_timeout_s: float,
        preemption: bool,
    ) -> None:
        self._worker = worker
        self._monitor = monitor
        self.runner = runner
        self.job_timeout_s = job_timeout_s
        self.preemption = preemption  # GPUQ_WORKER_PREEMPTION
        self._lock = threading.Lock()
        self._running: dict[str, tuple[Job, Execution]] = {}  # job id -> RQ's view of it, while it runs

    # ------------------------------------------------------------- intake

    def may_take_more(self) -> bool:
        """Not drained, not stopping (SIGTERM: finish, take no more), and no outage."""
        if not self._worker.taking_jobs():
            return False
        return self.runner.sql.wait_s <= 0 and self._worker.redis_health.wait_s <= 0

    def next_waiting(self, model: str, kind: str) -> tuple[Job, Queue] | None:
        """The job the fair pick gives next from the first band of the worker's ordered list
        that has one, if that band is ``model``'s for ``kind``; None when nothing waits,
        something more urgent does, or Redis does not answer (the live sequences go on;
        intake resumes with it)."""
        picker = self._worker.picker()
        ours = [band for band in picker.bands if parse_queue_name(band)[:2] == (model, kind)]
        try:
            while True:
                taken = picker.take(only=ours)
                if taken is None:
                    return None
                if picker.last_how == "stolen":
                    count_stolen(self._worker.connection, model)
                found = self._worker.fetch(*taken)
                if found is not None:
                    return found
        except RedisError as exc:
            self._worker.redis_health.failed("taking more jobs", exc)
        return None

    def waiting_priority(self, model: str, kind: str) -> int | None:
        """The priority of the job the fair pick would give next, if it is ``model``'s for
        ``kind``, left in its queue (a run with every slot taken decides from it whether to
        park for it); None otherwise, or while Redis does not answer."""
        try:
            found = self._worker.picker().peek()
        except RedisError as exc:
            self._worker.redis_health.failed("looking at the queues", exc)
            return None
        if found is None:
            return None
        queue_model, queue_kind, priority = parse_queue_name(found[0])
        return int(priority) if (queue_model, queue_kind) == (model, kind) else None

    def put_back(self, job: Job, queue: Queue) -> None:
        try:
            fair.push_front(self._worker.connection, queue.name, job.id)
        except RedisError as exc:  # popped, unclaimed: the reconciler enqueues it again (see start)
            self._worker.redis_health.failed(f"putting {job.id} back", exc)

    def must_run_alone(self, job: Job) -> bool:
        """Whether the job died beside others on a worker that crashed (see the reconciler);
        not known while Redis does not answer, when it runs as any other."""
        try:
            return bool(self._worker.connection.sismember(RUN_ALONE_KEY, job.id))
        except RedisError:
            return False

    # ------------------------------------------------------------- a job's start and end

    def start(self, job: Job, queue: Queue) -> Started | None:
        """RQ's execution, the monitor's watch and the SQL claim of a job taken from its queue;
        None when it is not to run (not queued any more in SQL, or SQL unreachable).

        The claim starts a run (``job_runs``) whose id fences the outcome: an outcome of an
        earlier run of the job (an admin requeued it while it ran here, say) never lands on
        this one, so nothing need be written before this claim."""
        try:
            execution = self._begin_execution(job)
        except RedisError as exc:
            # Popped, and its start written or not (Redis may have applied the writes and
            # gone down before the reply): in no list, its hash queued or started here, and
            # unclaimed, so the reconciler enqueues it again (see IN_FLIGHT_LIMIT_S).
            self._worker.redis_health.failed(f"starting {job.id}", exc)
            return None
        try:
            cancel = self._monitor.begin(job.id)
            claimed = self.runner.claim(job.id)
        except SQLAlchemyError:  # nothing ran: the job goes back to the front of its queue
            self._return_unclaimed(job, queue, execution)
            return None
        except Exception:
            # Infrastructure (SQL unreachable while claiming, say) or a defect: the row is
            # still queued, RQ's failed registry keeps the trace and the reconciler enqueues
            # the job again. (Raised from here, the execution would stay begun, heartbeat by
            # the monitor, its job unclaimed and untaken for as long as the worker lives.)
            log.exception("job %s could not be started", job.id)
            self.fail(job, queue, execution)
            return None
        if claimed is None:
            self.end(job, execution)
            return None
        with suppress(RedisError):  # else it runs alone once more, which is harmless
            self._worker.connection.srem(RUN_ALONE_KEY, job.id)  # running now (alone if it had to)
        return Started(job, queue, execution, cancel, claimed)

    def run_noop(self, job: Job, queue: Queue) -> None:
        """A job that runs no model (``noop``), start to end, on the caller's thread."""
        try:
            execution = self._begin_execution(job)
        except RedisError as exc:  # popped, unclaimed: the reconciler enqueues it again (see start)
            self._worker.redis_health.failed(f"starting {job.id}", exc)
            return
        self._monitor.begin(job.id)  # watched like any job: heartbeats keep its execution alive
        try:
            self.runner.run_noop(job.id)
        except SQLAlchemyError:  # the claim could not reach SQL: nothing ran
            self._return_unclaimed(job, queue, execution)
            return
        except Exception:
            # Only infrastructure errors get here (SQL unreachable while claiming, say). The
            # row is still queued in SQL; RQ's failed registry keeps the trace and the
            # reconciler enqueues the job again.
            log.exception("job %s could not be run", job.id)
            self.fail(job, queue, execution)
            return
        self.end(job, execution)

    def end(self, job: Job, execution: Execution) -> None:
        """RQ's bookkeeping of a job's end (its outcome is the writer's): sent now, or kept
        while Redis does not answer."""
        self._ended(job)
        worker = self._worker

        def send() -> None:
            busy = self.busy()
            with worker.connection.pipeline(transaction=False) as pipe:
                worker.cleanup_execution(job, pipeline=pipe, execution=execution)
                pipe.eval(_DELETE_UNLESS_QUEUED, 1, job.key)  # result_ttl=0: the result lives in SQL
                worker.increment_successful_job_count(pipeline=pipe)
                if not busy:
                    worker.set_state(WorkerStatus.IDLE, pipeline=pipe)
                pipe.hset(worker.key, SLOTS_BUSY_FIELD, busy)
                worker.publisher.loaded(pipe)
                pipe.execute()

        worker.publisher.send_or_keep(send, f"the end of {job.id}")

    def fail(self, job: Job, queue: Queue, execution: Execution) -> None:
        """RQ's failed registry keeps the trace being handled; the reconciler enqueues the job again."""
        self._ended(job)
        trace = traceback.format_exc()
        worker = self._worker

        def send() -> None:
            busy = self.busy()
            worker.handle_job_failure(job, queue, exc_string=trace, execution=execution)
            worker.connection.hset(worker.key, SLOTS_BUSY_FIELD, busy)
            if not busy:
                worker.set_state(WorkerStatus.IDLE)

        worker.publisher.send_or_keep(send, f"the failure of {job.id}")

    def busy(self) -> int:
        """How many jobs run here now."""
        with self._lock:
            return len(self._running)

    def executions(self) -> list[tuple[Job, Execution]]:
        """The jobs running now and their executions (heartbeats, a registration made again)."""
        with self._lock:
            return list(self._running.values())

    # ------------------------------------------------------------- RQ's bookkeeping

    def _begin_execution(self, job: Job) -> Execution:
        """RQ's bookkeeping of a job's start: its execution, registry entry and hash, one pipeline.

        Plain pipelines, not MULTI/EXEC: each write stands alone, and a half-applied one is
        repaired from SQL by the reconciler. The worker's own heartbeat is not repeated here;
        RQ's loop sends it (throttled) between jobs, the monitor during them."""
        worker = self._worker
        busy = self.busy() + 1
        with worker.connection.pipeline(transaction=False) as pipe:
            execution = Execution.create(job, worker.worker_ttl, pipeline=pipe, worker_name=worker.name)
            job.prepare_for_execution(worker.name, pipeline=pipe)
            # A job popped from a single queue went through RQ's intermediate list (LMOVE);
            # RQ's own worker removes it there only when it listens on one queue.
            pipe.lrem(rq_intermediate_key(rq_queue_key(job.origin)), 1, job.id)
            worker.set_state(WorkerStatus.BUSY, pipeline=pipe)
            pipe.hset(worker.key, SLOTS_BUSY_FIELD, busy)
            pipe.execute()
        with self._lock:
            self._running[job.id] = (job, execution)
        return execution

    def _ended(self, job: Job) -> int:
        """The monitor stops watching the job; returns how many jobs still run here."""
        self._monitor.end(job.id)
        with self._lock:
            self._running.pop(job.id, None)
            return len(self._running)

    def _return_unclaimed(self, job: Job, queue: Queue, execution: Execution) -> None:
        """The database could not be reached to claim the job: it goes back to the front of its
        queue, as it was, and the worker takes nothing until SQL answers (``runner.sql``). So
        an outage neither runs a job unrecorded nor empties the queues into RQ's failed
        registry. (If the claim did commit and only its reply was lost, the row is running on
        this worker: its next claim of the job adopts it, and the reconciler re-enqueues a
        row running where no worker runs it.)"""
        busy = self._ended(job)
        worker = self._worker
        with worker.connection.pipeline(transaction=False) as pipe:
            worker.cleanup_execution(job, pipeline=pipe, execution=execution)
            job.set_status(JobStatus.QUEUED, pipeline=pipe)
            fair.push_front_in(pipe, queue.name, job.id)
            if not busy:
                worker.set_state(WorkerStatus.IDLE, pipeline=pipe)
            pipe.hset(worker.key, SLOTS_BUSY_FIELD, busy)
            pipe.execute()
