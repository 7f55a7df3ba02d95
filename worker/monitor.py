"""A thread that watches the job the worker is running.

RQ's ``SimpleWorker`` runs a job in its own thread and sends no heartbeat until the job
returns, so a long generation would look like a dead worker. This thread keeps the
worker's key, the job's execution and its ``StartedJobRegistry`` entry alive.

Cancellation reaches the worker as an RQ ``stop-job`` command on its pub/sub channel
(see ``GpuqWorker.handle_payload``), which calls :meth:`JobMonitor.cancel` at once. Pub/sub
delivers at most once, so with each heartbeat this thread also checks the job's cancel
flag in Redis. Either way the token loop only reads a ``threading.Event``. Waking
rarely matters: on a machine whose cores all run llama.cpp, every wake-up of another
thread slows generation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError

from gpuq.redis_keys import cancel_flag_key

log = logging.getLogger(__name__)


class JobMonitor:
    """Watches the jobs the worker is running: one at a time, or several decoded together."""

    def __init__(
        self,
        redis: Redis,
        *,
        heartbeat: Callable[[], None],
        heartbeat_interval_s: float,
    ) -> None:
        self._redis = redis
        self._heartbeat = heartbeat
        self._interval_s = heartbeat_interval_s
        self._lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def begin(self, job_id: str) -> threading.Event:
        """Watch a job from now on; returns the event that is set when it is cancelled."""
        with self._lock:
            cancel = self._running[job_id] = threading.Event()
            return cancel

    def cancel(self, job_id: str) -> bool:
        """Cancel the job if it is running here now; True if it was."""
        with self._lock:
            event = self._running.get(job_id)
        if event is None:
            return False
        event.set()
        return True

    def end(self, job_id: str) -> None:
        with self._lock:
            self._running.pop(job_id, None)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            with self._lock:
                job_ids = list(self._running)
            if not job_ids:
                continue  # idle: RQ's own loop heartbeats between jobs
            try:
                self._heartbeat()
                with self._redis.pipeline(transaction=False) as pipe:
                    for job_id in job_ids:
                        pipe.exists(cancel_flag_key(job_id))
                    flags = pipe.execute()
                for job_id, flagged in zip(job_ids, flags, strict=True):
                    if flagged:
                        self.cancel(job_id)
            except RedisError:
                log.warning("monitor could not reach Redis; will retry", exc_info=True)
