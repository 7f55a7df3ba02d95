"""A thread that watches the job the worker is running.

RQ's ``SimpleWorker`` runs a job in its own thread and sends no heartbeat until the job
returns, so a long generation would look like a dead worker. This thread keeps the
worker's key, the job's execution and its ``StartedJobRegistry`` entry alive, and polls
the job's cancel flag so the token loop only has to read a ``threading.Event``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError

from gpuq.queues import cancel_flag_key

log = logging.getLogger(__name__)


class JobMonitor:
    def __init__(
        self,
        redis: Redis,
        *,
        heartbeat: Callable[[], None],
        heartbeat_interval_s: float,
        cancel_poll_interval_s: float,
    ) -> None:
        self._redis = redis
        self._heartbeat = heartbeat
        self._heartbeat_interval_s = heartbeat_interval_s
        self._poll_s = min(cancel_poll_interval_s, heartbeat_interval_s)
        self._lock = threading.Lock()
        self._job_id: str | None = None
        self._cancel = threading.Event()
        self._next_heartbeat = 0.0
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
            self._next_heartbeat = time.monotonic() + self._heartbeat_interval_s
            return self._cancel

    def end(self) -> None:
        with self._lock:
            self._job_id = None

    def _run(self) -> None:
        while not self._stopped.wait(self._poll_s):
            with self._lock:
                job_id, cancel, due = self._job_id, self._cancel, self._next_heartbeat
            if job_id is None:
                continue
            try:
                if self._redis.exists(cancel_flag_key(job_id)):
                    cancel.set()
                if time.monotonic() >= due:
                    self._heartbeat()
                    with self._lock:
                        self._next_heartbeat = time.monotonic() + self._heartbeat_interval_s
            except RedisError:
                log.warning("monitor could not reach Redis; will retry", exc_info=True)
