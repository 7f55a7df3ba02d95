"""The admin's controls as one worker sees them (gpuq/fleet/workers.py sends them): drained
or not, models to unload, a running job to stop or take back.

The flags in Redis are the truth; the commands on the worker's RQ pub/sub channel only say
"look now", because pub/sub is at-most-once. So the flags are re-read at most once a second
(``CONTROL_READ_GAP_S``), and at once after a command.

Threads. The pub/sub thread handles commands: it stops a running job through the monitor,
marks the flags changed, and unloads a model itself when the worker waits for work. The
worker's main thread reads the flags between jobs and applies unloads; a run's desk thread
reads them while the run goes on (``taking_jobs``), leaving unloads for the run's end. The
model cache is touched only under ``cache_lock``, which the worker holds while a run or its
housekeeping uses the cache, so an unload never pulls a model from under a job; the
unloads pending are changed under that lock, or by the desk while the run holds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from gpuq.fleet import workers as control
from worker.monitor import JobMonitor
from worker.publishing import Publisher

log = logging.getLogger(__name__)

CONTROL_READ_GAP_S = 1.0  # drain flags and unload requests are re-read at most this often


class AdminControls:
    def __init__(
        self,
        connection: Redis,
        *,
        worker_key: str,
        worker_name: str,
        host: str,
        unload_model: Callable[[str], object],
        publisher: Publisher,
        monitor: JobMonitor,
        cache_lock: threading.Lock,
    ) -> None:
        self._redis = connection
        self._worker_key = worker_key
        self._worker_name = worker_name
        self._host = host
        self._unload_model = unload_model
        self._publisher = publisher
        self._monitor = monitor
        self._cache_lock = cache_lock
        self._state = control.Control()
        self._read_at = float("-inf")
        self.changed = threading.Event()  # set by pub/sub: re-read the flags now (also ends a drained wait)
        self._unloads_pending: set[str] = set()

    @property
    def drained(self) -> bool:
        """By its own flag or its host's, as last read."""
        return self._state.drained

    def read(self, *, apply_unloads: bool = True) -> None:
        """Drain flags and unload requests, at most once a second unless pub/sub said they
        changed. During a run (``apply_unloads=False``, from its desk thread) unloads wait for
        its end."""
        now = time.monotonic()
        if now - self._read_at < CONTROL_READ_GAP_S and not self.changed.is_set():
            return
        self.changed.clear()
        self._read_at = now
        try:
            state = control.read_control(
                self._redis, worker_key=self._worker_key, worker_name=self._worker_name, host=self._host
            )
        except RedisError:
            log.warning("cannot read drain flags; keeping the last ones", exc_info=True)
            return
        if state.drained != self._state.drained:
            log.info("drained by an admin: taking no jobs" if state.drained else "undrained: taking jobs again")
        self._state = state
        if state.unload and not apply_unloads:
            self._unloads_pending |= state.unload
        elif state.unload:
            with self._cache_lock:
                self._unloads_pending |= state.unload
                self.apply_unloads()

    def apply_unloads(self) -> None:
        """Unload what an admin asked for; called with the cache lock held, never during a job."""
        if not self._unloads_pending:
            return
        models, self._unloads_pending = sorted(self._unloads_pending), set()
        for model in models:
            self._unload_model(model)
        log.info("unloaded %s as an admin asked", ", ".join(models))
        with self._redis.pipeline(transaction=False) as pipe:
            self._publisher.loaded(pipe)
            pipe.execute()
        control.unload_done(self._redis, self._worker_name, models)

    def handle(self, payload: dict[str, Any]) -> bool:
        """A command from the worker's pub/sub channel (on the pub/sub thread); False when it
        is none of gpuq's, for RQ to handle."""
        command = payload.get("command")
        if command == "stop-job":  # RQ's own, which would kill a work horse a SimpleWorker lacks
            if not self._monitor.cancel(str(payload.get("job_id"))):
                log.info("stop-job for %s, which is not running here", payload.get("job_id"))
            return True
        if command == control.REQUEUE_COMMAND:
            # The row is queued already; the stopped run's outcome, fenced by its run id, is
            # discarded whenever it is written, even after this worker claims the job again.
            job_id = str(payload.get("job_id"))
            if not self._monitor.cancel(job_id):
                log.info("requeue of %s, which is not running here", job_id)
            return True
        if command == control.CONTROL_COMMAND:
            self.changed.set()  # the main loop re-reads the flags
            return True
        if command == control.UNLOAD_COMMAND:
            self._unload_when_idle(str(payload.get("model")))
            return True
        return False

    def _unload_when_idle(self, model: str) -> None:
        """At once if the worker is waiting for work (the cache lock is free), else the main
        loop does it right after the job (the flag it re-reads says so too)."""
        if self._cache_lock.acquire(blocking=False):
            try:
                self._unloads_pending.add(model)
                self.apply_unloads()
            except RedisError:
                log.warning("unloaded %s but could not report it; will retry", model, exc_info=True)
            finally:
                self._cache_lock.release()
        else:
            self.changed.set()
