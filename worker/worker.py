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
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker
from rq.command import parse_payload
from rq.exceptions import DequeueTimeout
from rq.executions import Execution
from rq.job import Job
from rq.worker import Worker, WorkerStatus

from gpuq.queues import worker_queue_names
from worker.monitor import JobMonitor
from worker.runner import JobRunner

log = logging.getLogger(__name__)

IDLE_WRITE_GAP_S = 1.0
MAX_REDIS_BACKOFF_S = 30.0


class GpuqWorker(SimpleWorker):
    def __init__(
        self,
        *,
        runner: JobRunner,
        list_servable: Callable[[], list[tuple[str, str]]],
        loaded_models: Callable[[], list[str]],
        on_idle: Callable[[], object] = lambda: None,
        worker_ttl_s: int,
        heartbeat_interval_s: float,
        queue_refresh_interval_s: float = 5.0,
        **kwargs: object,
    ) -> None:
        self._list_servable = list_servable
        self._loaded_models = loaded_models
        self._on_idle = on_idle
        self._servable = list_servable()
        self._loaded_elsewhere: frozenset[str] = frozenset()
        self._order_key: tuple[list[tuple[str, str]], frozenset[str], frozenset[str]] | None = None
        self._queue_refresh_interval_s = queue_refresh_interval_s
        super().__init__(
            [Queue(name, connection=kwargs["connection"]) for name in worker_queue_names(self._servable)],
            name=runner.worker_name,
            worker_ttl=worker_ttl_s,
            **kwargs,  # type: ignore[arg-type]
        )
        self.runner = runner
        self._queues_refreshed_at = time.monotonic()
        self._last_heartbeat_mono = 0.0
        self._suspension_checked_at = 0.0
        self._published_loaded: str | None = None
        self._running: tuple[Job, Execution] | None = None
        self.monitor = JobMonitor(
            self.connection,
            heartbeat=self._heartbeat_running_job,
            heartbeat_interval_s=heartbeat_interval_s,
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
        backoff_s = 1.0
        while True:
            self._on_idle()  # unload models whose keep_alive ran out
            self._refresh_queues()
            self.heartbeat()
            if self.should_run_maintenance_tasks:
                self.run_maintenance_tasks()
            if not self._ordered_queues:  # nothing to serve (unhealthy GPU, no allowed model)
                if timeout is None:
                    return None
                time.sleep(timeout)
                continue
            try:
                result = self.queue_class.dequeue_any(
                    self._ordered_queues,
                    timeout,
                    connection=self.connection,
                    job_class=self.job_class,
                    serializer=self.serializer,
                    death_penalty_class=self.death_penalty_class,
                )
            except DequeueTimeout:
                continue
            except (RedisConnectionError, RedisTimeoutError):
                log.warning("cannot reach Redis; retrying in %.0f s", backoff_s, exc_info=True)
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_REDIS_BACKOFF_S)
                continue
            if result is not None:
                log.info("%s: %s", result[1].name, result[0].id)
            return result

    def _refresh_queues(self) -> None:
        """Re-read what this worker serves and what other workers hold every few seconds, and
        order the queues (see ``worker_queue_names``) after every job: its loaded set changes."""
        if time.monotonic() - self._queues_refreshed_at >= self._queue_refresh_interval_s:
            self._queues_refreshed_at = time.monotonic()
            servable = self._list_servable()
            if servable != self._servable:
                log.info("serving %s", ", ".join(f"{m} ({k})" for m, k in servable) or "nothing")
                self._servable = servable
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

    def execute_job(self, job: Job, queue: Queue) -> None:
        # Plain pipelines, not MULTI/EXEC: each write stands alone, and a half-applied one
        # is repaired from SQL by the reconciler. The worker's own heartbeat is not repeated
        # here; RQ's loop sends it (throttled) between jobs.
        with self.connection.pipeline(transaction=False) as pipe:
            execution = Execution.create(job, self.worker_ttl, pipeline=pipe, worker_name=self.name)
            job.prepare_for_execution(self.name, pipeline=pipe)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            pipe.execute()
        self._running = (job, execution)
        cancel = self.monitor.begin(job.id)
        try:
            self.runner.run(job.id, cancel)
        except Exception:
            # Only infrastructure errors get here (SQL unreachable while claiming, say). The
            # row is still queued in SQL; RQ's failed registry keeps the trace and the
            # reconciler enqueues the job again.
            log.exception("job %s could not be run", job.id)
            self.monitor.end()
            self._running = None
            self.handle_job_failure(job, queue, exc_string=traceback.format_exc(), execution=execution)
            self.set_state(WorkerStatus.IDLE)
            return
        self.monitor.end()
        self._running = None
        with self.connection.pipeline(transaction=False) as pipe:
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.delete(job.key)  # result_ttl=0: the result lives in SQL
            self.increment_successful_job_count(pipeline=pipe)
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self._publish_loaded(pipe)
            pipe.execute()

    def _publish_loaded(self, pipe: Pipeline) -> None:
        """Which models this worker holds, on its RQ worker hash (for telemetry and dashboards)."""
        loaded = ",".join(self._loaded_models())
        if loaded != self._published_loaded:
            self._published_loaded = loaded
            pipe.hset(self.key, mapping={"gpuq_loaded": loaded, "gpuq_gpus": ",".join(self.runner.gpu_uuids)})

    def _heartbeat_running_job(self) -> None:
        running = self._running
        with self.connection.pipeline(transaction=False) as pipe:
            self.heartbeat(self.worker_ttl, pipeline=pipe)
            if running is not None:
                job, execution = running
                execution.heartbeat(job.started_job_registry, self.worker_ttl, pipeline=pipe)
            pipe.execute()

    def handle_payload(self, message: dict[str, Any]) -> None:
        """RQ's command channel. ``stop-job`` cancels gpuq's running job at its next token;
        RQ's own handler would try to kill a work horse, which a SimpleWorker does not have."""
        payload = parse_payload(message)
        if payload.get("command") == "stop-job":
            if not self.monitor.cancel(str(payload.get("job_id"))):
                log.info("stop-job for %s, which is not running here", payload.get("job_id"))
            return
        super().handle_payload(message)

    # ------------------------------------------------------------- fewer writes

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        now = time.monotonic()
        if pipeline is None and timeout is None and now - self._last_heartbeat_mono < IDLE_WRITE_GAP_S:
            return
        self._last_heartbeat_mono = now
        super().heartbeat(timeout or self.worker_ttl, pipeline=pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        # RQ asks Redis on every loop; once a second is enough to honour `rq suspend`.
        now = time.monotonic()
        if now - self._suspension_checked_at >= IDLE_WRITE_GAP_S:
            self._suspension_checked_at = now
            super().check_for_suspension(burst)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and getattr(self, "_state", None) == state:
            return
        super().set_state(state, pipeline=pipeline)

    # ------------------------------------------------------------- lifecycle

    def bootstrap(self, *args: object, **kwargs: object) -> None:
        super().bootstrap(*args, **kwargs)  # type: ignore[arg-type]
        self.monitor.start()

    def teardown(self) -> None:
        self.monitor.stop()
        super().teardown()
