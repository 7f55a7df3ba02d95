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

from gpuq.jobs.queues import cancel_flag_key

log = logging.getLogger(__name__)


class JobMonitor:
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
        self._job_id: str | None = None
        self._cancel = threading.Event()
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
            self._job_id = job_id
            self._cancel = threading.Event()
            return self._cancel

    def cancel(self, job_id: str) -> bool:
        """Cancel the job if it is the one running now; True if it was."""
        with self._lock:
            if self._job_id != job_id:
                return False
            self._cancel.set()
            return True

    def end(self) -> None:
        with self._lock:
            self._job_id = None

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            with self._lock:
                job_id = self._job_id
            if job_id is None:
                continue  # idle: RQ's own loop heartbeats between jobs
            try:
                self._heartbeat()
                if self._redis.exists(cancel_flag_key(job_id)):
                    self.cancel(job_id)
            except RedisError:
                log.warning("monitor could not reach Redis; will retry", exc_info=True)
