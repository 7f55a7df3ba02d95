"""Whether the worker can reach the database and Redis, and how long to wait before trying
again.

Outages of either (a restart, a failover) must not crash a worker or churn its queues. A
worker that cannot reach SQL keeps serving what it holds (running sequences, heartbeats)
and takes no new job; one that cannot reach Redis keeps decoding its running sequences and
keeps the bookkeeping it could not send for later. Each retries after a backoff that
doubles from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S``. A streak of failures is logged
twice: the first failure with its traceback, then one line when the dependency answers.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0


class Dependency:
    """One thing the worker needs (``name``: "the database", "Redis") and its streak of failures."""

    def __init__(self, name: str, *, meanwhile: str) -> None:
        self.name = name
        self._meanwhile = meanwhile  # what the worker does while it is down, for the log
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic()
        self._failing_since = 0.0

    @property
    def wait_s(self) -> float:
        """How long until it should be tried again; 0 when it answers (or the wait is over)."""
        return max(0.0, self._retry_at - time.monotonic())

    @property
    def down(self) -> bool:
        return self._failures > 0

    def failed(self, what: str, exc: BaseException) -> None:
        if self._failures == 0:
            self._failing_since = time.monotonic()
            log.warning("%s is unreachable (%s); %s", self.name, what, self._meanwhile, exc_info=exc)
        self._failures += 1
        self._retry_at = time.monotonic() + min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (self._failures - 1))

    def succeeded(self) -> None:
        if self._failures:
            log.warning(
                "%s answers again, after %d failures over %.0f s",
                self.name,
                self._failures,
                time.monotonic() - self._failing_since,
            )
        self._failures = 0
        self._retry_at = 0.0
