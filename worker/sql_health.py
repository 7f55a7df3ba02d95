"""Whether the worker can reach its database, and how long to wait before trying again.

A database outage (a restart, a failover) must not crash a worker or churn its queues:
while SQL does not answer, the worker keeps serving what it already holds (running
sequences, their heartbeats), takes no new job, and retries after a backoff that doubles
from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S``. A streak of failures is logged twice: the
first failure with its traceback, then one line when SQL answers again.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0


class SqlHealth:
    def __init__(self) -> None:
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic()
        self._failing_since = 0.0

    @property
    def wait_s(self) -> float:
        """How long until SQL should be tried again; 0 when it answers (or the wait is over)."""
        return max(0.0, self._retry_at - time.monotonic())

    def failed(self, what: str, exc: BaseException) -> None:
        if self._failures == 0:
            self._failing_since = time.monotonic()
            log.warning("the database is unreachable (%s); taking no new job until it answers", what, exc_info=exc)
        self._failures += 1
        delay_s = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (self._failures - 1))
        self._retry_at = time.monotonic() + delay_s

    def succeeded(self) -> None:
        if self._failures:
            log.warning(
                "the database answers again, after %d failures over %.0f s",
                self._failures,
                time.monotonic() - self._failing_since,
            )
        self._failures = 0
        self._retry_at = 0.0
