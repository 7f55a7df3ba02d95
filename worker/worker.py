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
* admin controls (``gpuq/workers.py``): drained (by its own flag or its host's), it
  finishes its job and takes no more, staying alive and heartbeating; asked to unload a
  model, it does so at once when idle, else right after its job; told an admin requeued
  its running job, it stops it (the stopped run's outcome is fenced out by its run id).

What a run needs of it (intake from its queues, each job's claim and RQ execution) is
``RunHost``'s (worker/run_host.py), which the worker builds and hands to every run.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable
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
from rq.worker import Worker, WorkerStatus
from sqlalchemy.exc import SQLAlchemyError

from gpuq.db.tables import JobKind
from gpuq.fleet import workers as control
from gpuq.fleet.prefix_cache_stats import PrefixCacheStats
from gpuq.jobs import fair
from gpuq.jobs.queues import worker_queue_names
from gpuq.jobs.reconciler import redis_age_s
from gpuq.queue_names import parse_queue_name
from gpuq.redis_keys import (
    CANCEL_FLAG_TTL_S,
    GENERATES_FIELD,
    PREFIX_CACHE_FIELD,
    SLOTS_BUSY_FIELD,
    SLOTS_FIELD,
    loaded_expiry_key,
)
from worker.batching import EmbeddingRun, GenerationRun
from worker.monitor import JobMonitor
from worker.outages import RECONNECT_BACKOFF_MAX_S, Dependency
from worker.run_host import RunHost
from worker.runner import JobRunner

log = logging.getLogger(__name__)
job_lines = logging.getLogger(f"{__name__}.jobs")  # a line per job taken: quiet unless GPUQ_LOG_JOB_LINES

IDLE_WRITE_GAP_S = 1.0
CONTROL_READ_GAP_S = 1.0  # drain flags and unload requests are re-read at most this often
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
        connection: Redis,
        **kwargs: Any,  # RQ's other Worker options, passed on
    ) -> None:
        self._list_servable = list_servable
        self._loaded_models = loaded_models
        self._model_expiries = model_expiries
        self._published_expiries: dict[str, float | None] | None = None
        self._on_idle = on_idle
        self._unload_model = unload_model
        self._prefix_cache_stats = prefix_cache_stats
        self._servable = list_servable()
        self._loaded_elsewhere: frozenset[str] = frozenset()
        self._order_key: tuple[list[tuple[str, str]], frozenset[str], frozenset[str]] | None = None
        self._fair: fair.Picker | None = None
        self._queue_refresh_interval_s = queue_refresh_interval_s
        self.slots = slots
        super().__init__(
            [Queue(name, connection=connection) for name in worker_queue_names(self._servable)],
            name=runner.worker_name,
            worker_ttl=worker_ttl_s,
            connection=connection,
            **kwargs,
        )
        self.runner = runner
        self._queues_refreshed_at = time.monotonic()
        self._last_heartbeat_mono = 0.0
        self._suspension_checked_at = 0.0
        self._published_loaded: str | None = None
        self._published_generates: str | None = None
        # Held while the model cache is in use (a job, the idle housekeeping); free only
        # while the worker waits for work, which is when the pub/sub thread may unload.
        self._cache_lock = threading.Lock()
        # The admin's flags: read by the main thread and by a run's desk (``taking_jobs``),
        # re-read early when the pub/sub thread sets ``_control_changed``; the worker's own.
        self._control = control.Control()
        self._control_read_at = float("-inf")
        self._control_changed = threading.Event()  # set by pub/sub: re-read the flags now
        self._unloads_pending: set[str] = set()
        self.redis_health = Dependency(
            "Redis", meanwhile="decoding what runs, its bookkeeping kept for later", max_wait_s=RECONNECT_BACKOFF_MAX_S
        )
        self._unsent: list[Callable[[], None]] = []  # RQ bookkeeping that Redis could not take yet
        self.job_error: Exception | None = None  # what a job's run raised (RQ's loop then quits: see ended_unasked)
        self._asked_to_stop = False  # a signal asked the loop to stop (see request_stop)
        self.monitor = JobMonitor(
            self.connection,
            heartbeat=self._heartbeat_running_job,
            heartbeat_interval_s=heartbeat_interval_s,
        )
        self.host = RunHost(
            self, runner=runner, monitor=self.monitor, job_timeout_s=job_timeout_s, preemption=preemption
        )

    # ------------------------------------------------------------- queue list

    @property
    def dequeue_timeout(self) -> int:
        # Wake up often enough to heartbeat while idle and to see newly registered models.
        return max(1, min(int(self._queue_refresh_interval_s), self.worker_ttl // 3))

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
                self._control_changed.wait(pause_s)  # an undrain or other control message ends it early
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
        """The fair pick over this worker's ordered bands, rebuilt when the order changes."""
        names = [q.name for q in self._ordered_queues]
        if self._fair is None or self._fair.bands != names:
            self._fair = fair.Picker(self.connection, names)
        return self._fair

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
        if self._control.drained:  # take nothing; stay alive, heartbeat, wait for undrain
            return DRAINED_WAKE_S
        if not self._ordered_queues:  # nothing to serve (unhealthy GPU, no allowed model)
            return float(timeout or 0)
        waits = [d.wait_s for d in (self.runner.sql, self.redis_health) if d.wait_s > 0]
        if waits:  # a job taken now could not be claimed, or Redis does not answer
            return min(max(waits), self.dequeue_timeout)
        return None

    def _housekeeping(self) -> None:
        """Between jobs and on every idle wake-up: model expiry and unloads, the queue list,
        heartbeat, RQ's maintenance, and the admin's flags (each throttled where it costs).
        Raises RedisError if Redis does not answer."""
        self._send_unsent()
        with self._cache_lock:
            self._on_idle()  # unload models whose keep_alive ran out
            self._apply_unloads()
            self._refresh_queues()
            self._publish_models()
        self.heartbeat()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()
        self._read_control()

    def _put_back_if_drained(self, job: Job, queue: Queue) -> bool:
        """A drain may have come while this worker was blocked on its queues: the pub/sub
        message has set the event, or the flags are re-read (at most once a second, so a
        flood of jobs costs nothing here). A drained worker puts the job back in front."""
        self._read_control()
        if not self._control.drained:
            return False
        fair.push_front(self.connection, queue.name, job.id)
        log.info("drained: %s goes back to the front of %s", job.id, queue.name)
        return True

    def _read_control(self, *, apply_unloads: bool = True) -> None:
        """Drain flags and unload requests, at most once a second unless pub/sub said they changed.
        During a run (``apply_unloads=False``, from its desk thread) unloads wait for its end."""
        now = time.monotonic()
        if now - self._control_read_at < CONTROL_READ_GAP_S and not self._control_changed.is_set():
            return
        self._control_changed.clear()
        self._control_read_at = now
        try:
            state = control.read_control(
                self.connection, worker_key=self.key, worker_name=self.name, host=self.runner.host
            )
        except RedisError:
            log.warning("cannot read drain flags; keeping the last ones", exc_info=True)
            return
        if state.drained != self._control.drained:
            log.info("drained by an admin: taking no jobs" if state.drained else "undrained: taking jobs again")
        self._control = state
        if state.unload and not apply_unloads:
            self._unloads_pending |= state.unload
        elif state.unload:
            with self._cache_lock:
                self._unloads_pending |= state.unload
                self._apply_unloads()

    def _apply_unloads(self) -> None:
        """Unload what an admin asked for; called with the cache lock held, never during a job."""
        if not self._unloads_pending:
            return
        models, self._unloads_pending = sorted(self._unloads_pending), set()
        for model in models:
            self._unload_model(model)
        log.info("unloaded %s as an admin asked", ", ".join(models))
        with self.connection.pipeline(transaction=False) as pipe:
            self.publish_loaded(pipe)
            pipe.execute()
        control.unload_done(self.connection, self.name, models)

    def _refresh_queues(self) -> None:
        """Re-read what this worker serves and what other workers hold every few seconds, and
        order the queues (see ``worker_queue_names``) after every job: its loaded set changes."""
        if time.monotonic() - self._queues_refreshed_at >= self._queue_refresh_interval_s:
            self._queues_refreshed_at = time.monotonic()
            try:
                servable = self._list_servable()
            except SQLAlchemyError as exc:  # keep serving what it served; retried next interval
                self.runner.sql.failed("reading the models it serves", exc)
                servable = self._servable
            # A read that answers does not end the claims' backoff: on a full disk SQLite reads
            # and cannot write, and clearing it here had the worker retry a failing claim at
            # every wake-up. Only a claim that goes through ends it (``JobRunner.claim``).
            if servable != self._servable:
                log.info("serving %s", ", ".join(f"{m} ({k})" for m, k in servable) or "nothing")
                self._servable = servable
            self._publish_generates()
            self._loaded_elsewhere = self._models_loaded_by_others()
        key = (self._servable, frozenset(self._loaded_models()), self._loaded_elsewhere)
        if key == self._order_key:
            return
        self._order_key = key
        names = worker_queue_names(key[0], loaded=key[1], loaded_elsewhere=key[2], worker=self.name)
        self.queues = [Queue(n, connection=self.connection) for n in names]
        self._ordered_queues = self.queues[:]

    def _models_loaded_by_others(self) -> frozenset[str]:
        keys = [k for k in Worker.all_keys(connection=self.connection) if k != self.key]
        with self.connection.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "gpuq_loaded")
            values = pipe.execute()
        return frozenset(m for v in values if v for m in v.decode().split(",") if m)

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
        self._read_control(apply_unloads=False)  # throttled to once a second unless pub/sub said it changed
        return not (self._control.drained or self._stop_requested)

    # ------------------------------------------------------------- outages and figures

    def send_or_keep(self, send: Callable[[], None], what: str) -> None:
        """RQ bookkeeping that must reach Redis some time: sent now, or kept and sent by the
        loop once Redis answers (the outcome itself is in SQL already: nothing waits on it)."""
        try:
            send()
        except RedisError as exc:
            self.redis_health.failed(f"recording {what}", exc)
            self._published_loaded = None  # publish again with the kept bookkeeping
            self._unsent.append(send)

    def _send_unsent(self) -> None:
        while self._unsent:
            self._unsent[0]()  # RedisError: it stays first in line
            self._unsent.pop(0)

    def publish_loaded(self, pipe: Pipeline) -> None:
        """Which models this worker holds, on its RQ worker hash (for telemetry, dashboards
        and GET /v1/workers)."""
        loaded = ",".join(self._loaded_models())
        if loaded != self._published_loaded:
            self._published_loaded = loaded
            pipe.hset(
                self.key, mapping={control.LOADED_FIELD: loaded, control.GPUS_FIELD: ",".join(self.runner.gpu_uuids)}
            )

    def _publish_generates(self) -> None:
        """The models this worker serves generations of, on its RQ worker hash, when they
        changed: the API refuses a job asking for more samples than the slots of every worker
        serving its model (gpuq/fleet/sample_limit.py). Raises RedisError, and publishes at
        the next refresh, if Redis does not answer."""
        generates = json.dumps(sorted({m for m, kind in self._servable if kind == JobKind.GENERATE.value}))
        if generates != self._published_generates:
            self.connection.hset(self.key, GENERATES_FIELD, generates)
            self._published_generates = generates

    def _publish_models(self) -> None:
        """Between jobs: the models loaded (a keep_alive may have unloaded one since the last
        job's end) and when each will be unloaded if unused (Ollama's /api/ps shows it),
        written only when they changed."""
        expiries = self._model_expiries()
        if expiries == self._published_expiries:
            return
        key = loaded_expiry_key(self.name)
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                self.publish_loaded(pipe)
                pipe.delete(key)
                if expiries:
                    pipe.hset(key, mapping={m: "" if at is None else f"{at:.3f}" for m, at in expiries.items()})
                    pipe.expire(key, CANCEL_FLAG_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish model expiry times", exc_info=True)
            return
        self._published_expiries = expiries

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
            self.publish_loaded(pipe)
            pipe.execute()

    def handle_payload(self, message: dict[str, Any]) -> None:
        """RQ's command channel. ``stop-job`` cancels gpuq's running job at its next token;
        RQ's own handler would try to kill a work horse, which a SimpleWorker does not have."""
        payload = parse_payload(message)
        command = payload.get("command")
        if command == "stop-job":
            if not self.monitor.cancel(str(payload.get("job_id"))):
                log.info("stop-job for %s, which is not running here", payload.get("job_id"))
            return
        if command == control.REQUEUE_COMMAND:
            # The row is queued already; the stopped run's outcome, fenced by its run id, is
            # discarded whenever it is written, even after this worker claims the job again.
            job_id = str(payload.get("job_id"))
            if not self.monitor.cancel(job_id):
                log.info("requeue of %s, which is not running here", job_id)
            return
        if command == control.CONTROL_COMMAND:
            self._control_changed.set()  # the main loop re-reads the flags
            return
        if command == control.UNLOAD_COMMAND:
            self._unload_when_idle(str(payload.get("model")))
            return
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

    def _unload_when_idle(self, model: str) -> None:
        """At once if the worker is waiting for work (the cache lock is free), else the main
        loop does it right after the job (the flag it re-reads says so too)."""
        if self._cache_lock.acquire(blocking=False):
            try:
                self._unloads_pending.add(model)
                self._apply_unloads()
            except RedisError:
                log.warning("unloaded %s but could not report it; will retry", model, exc_info=True)
            finally:
                self._cache_lock.release()
        else:
            self._control_changed.set()

    # ------------------------------------------------------------- fewer writes

    # RQ's own loop quits at the first Redis error from any of these; a gpuq worker rides out
    # an outage instead (its running jobs go on, see ``_send_or_keep``).

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        now = time.monotonic()
        if pipeline is None and timeout is None and now - self._last_heartbeat_mono < IDLE_WRITE_GAP_S:
            return
        self._last_heartbeat_mono = now
        if pipeline is not None:
            super().heartbeat(timeout or self.worker_ttl, pipeline=pipeline)
            self._publish_prefix_cache(pipeline)
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout or self.worker_ttl, pipeline=pipe)
                self._publish_prefix_cache(pipe)
                if pipe.execute()[0]:  # HSET created last_heartbeat: the hash was gone
                    self._register_again()
        except RedisError as exc:
            self.redis_health.failed("sending its heartbeat", exc)

    def _publish_prefix_cache(self, pipe: Pipeline) -> None:
        """Its prefix cache's figures, for /metrics and the dashboard, with each heartbeat."""
        if self._prefix_cache_stats is not None:
            pipe.hset(self.key, PREFIX_CACHE_FIELD, self._prefix_cache_stats().to_json())

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
        self._published_loaded = ""
        self.connection.hset(
            self.key,
            mapping={
                control.HOST_FIELD: self.runner.host,
                control.SLOT_FIELD: slot_of(self.name),
                control.DEVICE_FIELD: self.runner.device,
                control.GPUS_FIELD: ",".join(self.runner.gpu_uuids),
                control.LOADED_FIELD: "",
                SLOTS_FIELD: self.slots,
                SLOTS_BUSY_FIELD: 0,
            },
        )
        self._published_generates = None
        self._publish_generates()

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
        super().teardown()
