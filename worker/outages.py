"""Whether the worker can reach the database and Redis, and how long to wait before trying
again.

Outages of either (a restart, a failover) must not crash a worker or churn its queues. A
worker that cannot reach SQL keeps serving what it holds (running sequences, heartbeats)
and takes no new job; one that cannot reach Redis keeps decoding its running sequences and
keeps the bookkeeping it could not send for later. Each retries after a backoff that
doubles from ``BACKOFF_START_S`` to ``BACKOFF_MAX_S`` (``RECONNECT_BACKOFF_MAX_S`` for a
running worker's Redis and for the wait at start; the exponent capped too, so a streak of any
length never overflows). A streak of failures is logged twice: the first failure with its
traceback, then one line when the dependency answers.

A worker that cannot reach either at start waits for both (``wait_for_dependencies``);
one whose start fails all the same because of an outage exits with ``EXIT_OUTAGE``, which
its supervisor restarts after a backoff without counting it as a crash: an outage says
nothing about the GPU.
"""

from __future__ import annotations

import logging
import threading
import time

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
# Where a try is one cheap connection attempt (a running worker's Redis, both dependencies
# while a worker or supervisor waits to start), it is made at least this often: what a longer
# wait costs is the time after the outage before jobs flow again.
RECONNECT_BACKOFF_MAX_S = 2.0


def backoff_s(failures: int, *, start_s: float = BACKOFF_START_S, max_s: float = BACKOFF_MAX_S) -> float:
    """The wait after ``failures`` failures in a row: doubling from ``start_s``, at most ``max_s``."""
    return min(max_s, start_s * 2.0 ** min(max(failures - 1, 0), 32))


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis or the database could not be reached (refused, lost, timed
    out), as opposed to a fault of the worker or its GPU."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | DisconnectionError | PoolTimeoutError):
        return True
    # OperationalError and InterfaceError are how both drivers report a lost or refused connection.
    return isinstance(exc, DBAPIError) and (
        exc.connection_invalidated or type(exc).__name__ in {"OperationalError", "InterfaceError"}
    )


def wait_for_dependencies(sessions: sessionmaker[Session], redis: Redis, stop: threading.Event | None = None) -> bool:
    """Blocks until the database and Redis both answer (False if ``stop`` is set first)."""
    database = Dependency(
        "the database", meanwhile="waiting for it before starting", max_wait_s=RECONNECT_BACKOFF_MAX_S
    )
    queue = Dependency("Redis", meanwhile="waiting for it before starting", max_wait_s=RECONNECT_BACKOFF_MAX_S)
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            with sessions() as session:
                store.check_database(session)
            database.succeeded()
            redis.ping()
            queue.succeeded()
            return True
        except Exception as exc:
            if not is_outage(exc):
                raise
            (database if isinstance(exc, DBAPIError | DisconnectionError | PoolTimeoutError) else queue).failed(
                "starting", exc
            )
            stop.wait(max(database.wait_s, queue.wait_s))
    return False


class Dependency:
    """One thing the worker needs (``name``: "the database", "Redis") and its streak of failures."""

    def __init__(self, name: str, *, meanwhile: str, max_wait_s: float = BACKOFF_MAX_S) -> None:
        self.name = name
        self._meanwhile = meanwhile  # what the worker does while it is down, for the log
        self._max_wait_s = max_wait_s
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic()
        self._failing_since = 0.0

    @property
    def wait_s(self) -> float:
        """How long until it should be tried again; 0 when it answers (or the wait is over)."""
        return max(0.0, self._retry_at - time.monotonic())

    def failed(self, what: str, exc: BaseException) -> None:
        if self._failures == 0:
            self._failing_since = time.monotonic()
            log.warning("%s is unreachable (%s); %s", self.name, what, self._meanwhile, exc_info=exc)
        self._failures += 1
        self._retry_at = time.monotonic() + backoff_s(self._failures, max_s=self._max_wait_s)

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
