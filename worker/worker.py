"""The per-GPU worker: an RQ ``SimpleWorker`` that keeps models loaded between jobs.

It keeps RQ's worker registration, queues, job hashes, executions and registries, so
``rq info`` shows it, and overrides only the hooks where a job system whose record
lives in SQL can do less than plain RQ:

* ``execute_job``: one Redis pipeline to start a job and one to end it (plain RQ spends
  a dozen round trips), no result copy in Redis (SQL holds it), and a monitor thread
  for heartbeats while the job runs.
* ``handle_payload``: RQ's ``stop-job`` command cancels the running job between tokens.
* ``heartbeat``, ``check_for_suspension`` and ``set_state``: at most once a second, or
  only when something changed, instead of on every loop.
* the queue list is refreshed from the registry and the affinity rules, so a new model
  or a changed rule is served without a restart, and is ordered with the models this
  worker has loaded first within each priority (sticky routing).
* prefix-aware placement (``gpuq.jobs.prefix_routing``): its pick takes its own lane first
  within a tenant's fair turn, and another's lane whose first job waited past the steal
  bound; its heartbeats carry the starts its caches hold (worker/prefix_index.py); drained,
  serving nothing or stopping, it hands its lane back to the shared queues.
* admin controls (``gpuq/fleet/workers.py``): drained (by its own flag or its host's), it
  finishes its job and takes no more, staying alive and heartbeating; asked to unload a
  model, it does so at once when idle, else right after its job; told an admin requeued
  its running job, it stops it (the stopped run's outcome is fenced out by its run id).

Three parts are their own: what a run needs of it (intake from its queues, each job's
claim and RQ execution) is ``RunHost``'s (worker/run_host.py); the admin's flags and
commands are ``AdminControls``' (worker/admin_controls.py); what it writes on its worker
hash for the fleet to read, and the bookkeeping kept through an outage, is
``Publisher``'s (worker/publishing.py). The worker builds them and keeps RQ's loop, the
order of its queues, its registration and heartbeats.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from types import FrameType
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError
from rq import Queue, SimpleWorker
from rq.command import parse_payload
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.executions import ExecutionRegistry
from rq.job import Job
from rq.worker import WorkerStatus

from gpuq.db.tables import JobKind
from gpuq.fleet.prefix_cache_stats import PrefixCacheStats
from gpuq.jobs import fair
from gpuq.jobs.prefix_routing import count_stolen, hand_back
from gpuq.jobs.reconciler import redis_age_s
from gpuq.queue_names import parse_queue_name
from gpuq.redis_keys import SLOTS_BUSY_FIELD
from worker.admin_controls import AdminControls
from worker.batching import EmbeddingRun, GenerationRun
from worker.monitor import JobMonitor
from worker.outages import RECONNECT_BACKOFF_MAX_S, Dependency
from worker.prefix_index import IndexPublisher
from worker.publishing import Publisher
from worker.queue_order import QueueOrder
from worker.run_host import RunHost
from worker.runner import JobRunner

log = logging.getLogger(__name__)
job_lines = logging.getLogger(f"{__name__}.jobs")  # a line per job taken: quiet unless GPUQ_LOG_JOB_LINES

IDLE_WRITE_GAP_S = 1.0
DRAINED_WAKE_S = 1.0  # a drained worker checks its flags (and keep_alive expiries) this often
PUBSUB_WAKE_S = 1.0  # RQ's command listener sees a stop this soon (see subscribe)


def slot_of(worker_name: str) -> str:
    """``<hostname>.<slot>.<pid>.<hex>`` (see worker/main.py); host names may hold dots."""
    parts = worker_name.rsplit(".", 3)
    return parts[1] if len(parts) == 4 else ""


class GpuqWorker(SimpleWorker):
    def __init__(
        self,
        *,
        runner: JobRunner,
        list_servable: Callable[[], list[tuple[str, str]]],
        loaded_models: Callable[[], list[str]],
        model_expiries: Callable[[], dict[str, float | None]] = dict,
        on_idle: Callable[[], object] = lambda: None,
        unload_model: Callable[[str], object] = lambda _name: None,
        worker_ttl_s: int,
        heartbeat_interval_s: float,
        queue_refresh_interval_s: float = 5.0,
        job_timeout_s: float = 3600.0,
        slots: int = 1,
        preemption: bool = True,
        prefix_cache_stats: Callable[[], PrefixCacheStats] | None = None,
        prefix_index: Callable[[], set[bytes]] | None = None,
        steal_s: float = fair.STEAL_S,
        connection: Redis,
        **kwargs: Any,  # RQ's other Worker options, passed on
    ) -> None:
        self._on_idle = on_idle
        self.slots = slots
        self.order = QueueOrder(
            connection,
            worker_name=runner.worker_name,
            list_servable=list_servable,
            loaded_models=loaded_models,
            refresh_interval_s=queue_refresh_interval_s,
            sql=runner.sql,
            steal_s=steal_s,
        )
        super().__init__(
            [Queue(name, connection=connection) for name in self.order.names],
            name=runner.worker_name,
            worker_ttl=worker_ttl_s,
            connection=connection,
            **kwargs,
        )
        self.runner = runner
        self._last_heartbeat_mono = 0.0
        self._suspension_checked_at = 0.0
        # Held while the model cache is in use (a job, the idle housekeeping); free only
        # while the worker waits for work, which is when the pub/sub thread may unload.
        self._cache_lock = threading.Lock()
        self.redis_health = Dependency(
            "Redis", meanwhile="decoding what runs, its bookkeeping kept for later", max_wait_s=RECONNECT_BACKOFF_MAX_S
        )
        self.publisher = Publisher(
            connection,
            key=self.key,
            name=self.name,
            runner=runner,
            loaded_models=loaded_models,
            model_expiries=model_expiries,
            prefix_cache_stats=prefix_cache_stats,
            redis_health=self.redis_health,
        )
        # The starts its caches hold, for the API's prefix-aware placement (None: routing off).
        self.index = None if prefix_index is None else IndexPublisher(self.name, prefix_index, ttl_s=worker_ttl_s)
        self.job_error: Exception | None = None  # what a job's run raised (RQ's loop then quits: see ended_unasked)
        self._asked_to_stop = False  # a signal asked the loop to stop (see request_stop)
        self.monitor = JobMonitor(
            self.connection,
            heartbeat=self._heartbeat_running_job,
            heartbeat_interval_s=heartbeat_interval_s,
        )
        self.controls = AdminControls(
            connection,
            worker_key=self.key,
            worker_name=self.name,
            host=runner.host,
            unload_model=unload_model,
            publisher=self.publisher,
            monitor=self.monitor,
            cache_lock=self._cache_lock,
        )
        self.host = RunHost(
            self, runner=runner, monitor=self.monitor, job_timeout_s=job_timeout_s, preemption=preemption
        )

    # ------------------------------------------------------------- queue list

    @property
    def dequeue_timeout(self) -> int:
        # Wake up often enough to heartbeat while idle and to see newly registered models.
        return max(1, min(int(self.order.refresh_interval_s), self.worker_ttl // 3))

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's idle loop, with the queue list refreshed on every wake-up (RQ's own loop keeps
        blocking on the queues it started with). ``max_idle_time`` is not supported."""
        self.set_state(WorkerStatus.IDLE)
        while True:
            # Only an answered wait for jobs says Redis is back: housekeeping skips Redis for
            # seconds at a time (its writes are throttled), so its passing proves nothing, and
            # taking it for an answer reset the backoff and spun this loop through the outage.
            try:
                self._housekeeping()
            except RedisError as exc:
                self.redis_health.failed("between jobs", exc)
            pause_s = self._pause_s(timeout)
            if pause_s is not None:
                if timeout is None:
                    return None
                self.controls.changed.wait(pause_s)  # an undrain or other control message ends it early
                continue
            try:
                result = self._take_next(timeout)
            except DequeueTimeout:
                self.redis_health.succeeded()
                continue
            except RedisError as exc:
                self.redis_health.failed("waiting for jobs", exc)
                continue
            self.redis_health.succeeded()
            if result is not None:
                if self._put_back_if_drained(*result):
                    continue
                job_lines.info("%s: %s", result[1].name, result[0].id)
            return result

    def picker(self) -> fair.Picker:
        """The fair pick over this worker's ordered bands (``QueueOrder``)."""
        return self.order.picker()

    def _take_next(self, timeout: int | None) -> tuple[Job, Queue] | None:
        """The next job by priority, then fair shares between tenants (``gpuq.jobs.fair``):
        RQ's ``dequeue_any`` with the pick in place of its ``BLPOP``. With nothing waiting it
        blocks on the bands' bells up to ``timeout`` (None: it does not block), then looks
        once more; DequeueTimeout when still nothing came."""
        picker = self.picker()
        waited = timeout is None
        while True:
            taken = picker.take()
            if taken is None:
                if waited:
                    if timeout is None:
                        return None
                    raise DequeueTimeout(timeout, picker.bells)
                picker.wait(timeout or 1)
                waited = True
                continue
            found = self.fetch(*taken)
            if picker.last_how == "stolen":
                count_stolen(self.connection, parse_queue_name(taken[0])[0])
            if found is not None:
                return found

    def fetch(self, queue_name: str, job_id: str) -> tuple[Job, Queue] | None:
        """RQ's job for an id taken from a queue; None when its hash is gone (cancelled), as
        RQ's own dequeue skips such ids."""
        queue = Queue(queue_name, connection=self.connection, job_class=self.job_class, serializer=self.serializer)
        try:
            job = self.job_class.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError:
            return None
        return job, queue

    def _pause_s(self, timeout: int | None) -> float | None:
        """How long to wait before looking at the queues, when no job should be taken now."""
        if self.controls.drained:  # take nothing; stay alive, heartbeat, wait for undrain
            self.order.hand_back_lane(self.redis_health)
            return DRAINED_WAKE_S
        if not self.order.names:  # nothing to serve (unhealthy GPU, no allowed model)
            self.order.hand_back_lane(self.redis_health)
            return float(timeout or 0)
        self.order.lane_in_use()
        waits = [d.wait_s for d in (self.runner.sql, self.redis_health) if d.wait_s > 0]
        if waits:  # a job taken now could not be claimed, or Redis does not answer
            return min(max(waits), self.dequeue_timeout)
        return None

    def _housekeeping(self) -> None:
        """Between jobs and on every idle wake-up: model expiry and unloads, the queue list,
        heartbeat, RQ's maintenance, and the admin's flags (each throttled where it costs).
        Raises RedisError if Redis does not answer."""
        self.publisher.send_unsent()
        with self._cache_lock:
            self._on_idle()  # unload models whose keep_alive ran out
            self.controls.apply_unloads()
            if self.order.refresh():
                self.queues = [Queue(n, connection=self.connection) for n in self.order.names]
                self._ordered_queues = self.queues[:]
            self.publisher.generates(self.order.servable)
            self.publisher.models()
        self.heartbeat()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()
        self.controls.read()

    def _put_back_if_drained(self, job: Job, queue: Queue) -> bool:
        """A drain may have come while this worker was blocked on its queues: the pub/sub
        message has set the event, or the flags are re-read (at most once a second, so a
        flood of jobs costs nothing here). A drained worker puts the job back in front."""
        self.controls.read()
        if not self.controls.drained:
            return False
        fair.push_front(self.connection, queue.name, job.id)
        log.info("drained: %s goes back to the front of %s", job.id, queue.name)
        return True

    # ------------------------------------------------------------- running a job

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        # RQ records a stop asked for only while a job runs: an idle worker's loop ends by
        # StopRequested with nothing recorded, which would read as a crash (ended_unasked).
        self._asked_to_stop = True
        super().request_stop(signum, frame)

    @property
    def ended_unasked(self) -> bool:
        """RQ's loop returned although no signal asked it to stop: something raised inside
        it, which RQ logs ("found an unhandled exception, quitting", with its traceback) and
        swallows. (Outages never get there: every Redis call of the loop rides them out.)"""
        return not (self._asked_to_stop or self._stop_requested)

    def execute_job(self, job: Job, queue: Queue) -> None:
        with self._cache_lock:
            kind = parse_queue_name(queue.name)[1]
            model = parse_queue_name(queue.name)[0]
            try:
                if kind == JobKind.GENERATE:
                    GenerationRun(self.host, queue, model, kind).run(job)  # this job, and others of its model beside it
                elif kind == JobKind.EMBED:
                    EmbeddingRun(self.host, queue, model, kind).run(job)  # this job, and others of its model waiting
                else:
                    self.host.run_noop(job, queue)
            except Exception as exc:
                self.job_error = exc
                raise

    def taking_jobs(self) -> bool:
        """Not drained and not stopping (SIGTERM: finish, take no more); asked by a run's desk."""
        self.controls.read(apply_unloads=False)  # throttled to once a second unless pub/sub said it changed
        return not (self.controls.drained or self._stop_requested)

    # ------------------------------------------------------------- heartbeats

    def _heartbeat_running_job(self) -> None:
        running = self.host.executions()
        with self.connection.pipeline(transaction=False) as pipe:
            self.heartbeat(self.worker_ttl, pipeline=pipe)
            for job, execution in running:
                execution.heartbeat(job.started_job_registry, self.worker_ttl, pipeline=pipe)
            if pipe.execute()[0]:  # HSET created last_heartbeat: the hash was gone
                self._register_again()

    def _register_again(self) -> None:
        """Redis lost this worker's registration (it restarted empty, without persistence):
        register again, with the executions of the jobs running here, so that neither the
        reconciler nor ``GET /v1/workers`` takes a live worker for a dead one, nor its jobs
        for orphans. The queues themselves are rebuilt from SQL by the reconciler."""
        log.warning("Redis lost this worker's registration (restarted empty?); registering again")
        redis_age_s(self.connection)  # marks when Redis's data began, if nobody has yet
        self.connection.delete(self.key)
        self.register_birth()
        with self.connection.pipeline(transaction=False) as pipe:
            for job, execution in self.host.executions():
                execution.save(ttl=self.worker_ttl, pipeline=pipe)
                ExecutionRegistry(job_id=job.id, connection=pipe).add(execution, ttl=self.worker_ttl, pipeline=pipe)
                job.started_job_registry.add_execution(execution, pipeline=pipe, ttl=self.worker_ttl)
                pipe.sadd(self.executions_key, execution.composite_key)
                job.prepare_for_execution(self.name, pipeline=pipe)
            pipe.hset(self.key, SLOTS_BUSY_FIELD, self.host.busy())
            self.publisher.loaded(pipe)
            pipe.execute()

    def handle_payload(self, message: dict[str, Any]) -> None:
        """RQ's command channel: gpuq's commands (and RQ's ``stop-job``) are the admin
        controls'; RQ handles the rest."""
        if not self.controls.handle(parse_payload(message)):
            super().handle_payload(message)

    def subscribe(self) -> None:
        """RQ's, with its listener thread waking every second instead of every minute. RQ's
        teardown unsubscribes, counting on Redis's reply to wake that thread, and then stops
        it; when the reply comes first, the thread goes back to waiting, up to RQ's
        ``sleep_time`` (60 s), and redis-py 8.2's ``PubSubWorkerThread.stop()`` waits for it.
        Idle workers told to stop sat there up to a minute (seen: every worker of a
        supervisor's drain): the drain, `gpuq up`'s Ctrl-C and a killed parent's orphans all
        waited on them."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ types it as None
            sleep_time=PUBSUB_WAKE_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    # ------------------------------------------------------------- fewer writes

    # RQ's own loop quits at the first Redis error from any of these; a gpuq worker rides out
    # an outage instead (its running jobs go on, see ``Publisher.send_or_keep``).

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        now = time.monotonic()
        if pipeline is None and timeout is None and now - self._last_heartbeat_mono < IDLE_WRITE_GAP_S:
            return
        self._last_heartbeat_mono = now
        if pipeline is not None:
            super().heartbeat(timeout or self.worker_ttl, pipeline=pipeline)
            self.publisher.prefix_cache(pipeline)
            if self.index is not None:
                self.index.send(pipeline)
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout or self.worker_ttl, pipeline=pipe)
                self.publisher.prefix_cache(pipe)
                if self.index is not None:
                    self.index.send(pipe)
                if pipe.execute()[0]:  # HSET created last_heartbeat: the hash was gone
                    self._register_again()
        except RedisError as exc:
            if self.index is not None:
                self.index.forget()
            self.redis_health.failed("sending its heartbeat", exc)

    def check_for_suspension(self, burst: bool) -> None:
        # RQ asks Redis on every loop; once a second is enough to honour `rq suspend`.
        now = time.monotonic()
        if now - self._suspension_checked_at >= IDLE_WRITE_GAP_S:
            self._suspension_checked_at = now
            try:
                super().check_for_suspension(burst)
            except RedisError as exc:
                self.redis_health.failed("checking for `rq suspend`", exc)

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except RedisError as exc:
            self.redis_health.failed("cleaning RQ's registries", exc)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and getattr(self, "_state", None) == state:
            return
        if pipeline is not None:
            super().set_state(state, pipeline=pipeline)
            return
        try:
            super().set_state(state)
        except RedisError as exc:
            self._state = ""  # unknown to Redis: set again next time
            self.redis_health.failed("publishing its state", exc)

    # ------------------------------------------------------------- lifecycle

    def register_birth(self) -> None:
        """RQ's registration, plus what GET /v1/workers shows about a gpuq worker."""
        super().register_birth()
        self.publisher.registered(slot=slot_of(self.name), slots=self.slots, servable=self.order.servable)

    def bootstrap(
        self,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        # RQ installs its signal handlers only after registering the worker, so a SIGTERM in
        # between (a stop right after a start, which sees the worker registered) took the
        # default action: the worker died by the signal, read as a crash. Until RQ's handlers
        # are in, a stop is only recorded; the loop's first turn sees it and stops cleanly.
        signal.signal(signal.SIGTERM, self._stop_before_the_loop)
        signal.signal(signal.SIGINT, self._stop_before_the_loop)
        super().bootstrap(logging_level, date_format, log_format)
        self.monitor.start()

    def _stop_before_the_loop(self, signum: int, frame: FrameType | None) -> None:
        self._asked_to_stop = True
        self._stop_requested = True

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """A signal after the first: a second SIGINT (a second Ctrl-C) stops cold, as in RQ; a
        SIGTERM never does. SIGTERM is how gpuq says "finish, then stop", and it often comes
        twice: the supervisor's drain beside the kernel's death signal when the supervisor
        exits (``gpuq.children``), a terminal's Ctrl-C reaching the whole process group, a
        service manager signalling every process of the unit. RQ's cold stop on the second
        one threw away every sequence mid-decode; the supervisor's kill after
        ``DRAIN_TIMEOUT_S`` stays the bound on a drain."""
        if signum == signal.SIGTERM:
            log.info("worker %s: SIGTERM again while finishing its jobs: still finishing them", self.name)
            return
        super().request_force_stop(signum, frame)

    def teardown(self) -> None:
        self.monitor.stop()
        with suppress(RedisError):  # else the reconciler hands the lane back, and the index expires
            hand_back(self.connection, self.name)
            if self.index is not None:
                self.connection.delete(self.index.key)
        super().teardown()
