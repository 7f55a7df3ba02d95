"""The scheduler: the periodic duties of a gpuq system, run by ``gpuq scheduler`` and inside ``gpuq up``.

Every tick (``TICK_S``) it runs the duties that are due, one after the other:

* ``aging``: a job that waited ``GPUQ_PRIORITY_AGING_S`` moves up one priority;
* ``schedules``: cron schedules that are due start their batch;
* ``batches``: expiry and finalisation (output files, final status);
* ``webhooks``: due deliveries are handed to a pool of threads, so a slow receiver does
  not hold up the tick;
* ``reconciler`` (every ``GPUQ_RECONCILE_INTERVAL_S``): SQL and Redis brought back in line,
  jobs of dead workers recovered;
* ``rollups`` (as often): the stats of days that have ended are rolled up, so no stats
  request pays for them.

Each duty fails on its own: the others keep their pace while it backs off (its interval
doubled per consecutive failure, up to ``MAX_BACKOFF_S``), and a streak of failures is
logged twice, not once a tick: the first failure with its traceback, then one line when
the duty recovers. Every duty is safe to run in several schedulers at once (conditional
updates and unique rows decide who does what), so running two schedulers is harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from redis import Redis

from gpuq.batches.destinations import DestinationPolicy, Resolve, system_resolve
from gpuq.batches.queue_order import Planning
from gpuq.batches.schedules import fire_due_schedules
from gpuq.batches.service import advance_batches
from gpuq.batches.webhooks import DeliveryPool, load_secret
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import utcnow
from gpuq.jobs import outcome_spool
from gpuq.jobs.aging import promote_aged_jobs
from gpuq.jobs.reconciler import reconcile_once
from gpuq.private_files import warn_if_open_to_others
from gpuq.settings import Settings
from gpuq.stats import rollups

log = logging.getLogger(__name__)

TICK_S = 1.0
MAX_BACKOFF_S = 60.0  # a duty that keeps failing is still retried every minute, so it resumes soon after a fix


@dataclass
class Duty:
    """One periodic task of the scheduler, with its own streak of failures."""

    name: str
    function: Callable[[], object]
    interval_s: float
    next_run_at: float = 0.0  # time.monotonic(); 0: at the first tick
    failures: int = 0  # consecutive, reset by a success
    failing_since: datetime | None = None

    @property
    def delay_s(self) -> float:
        """The wait before the next run: the interval, doubled per consecutive failure, capped."""
        if self.failures == 0:
            return self.interval_s
        return max(self.interval_s, min(MAX_BACKOFF_S, self.interval_s * 2**self.failures))

    def due(self, now: float) -> bool:
        return now >= self.next_run_at

    def run(self) -> None:
        """Run once; a failure is recorded (and logged once per streak), never raised."""
        try:
            self.function()
        except Exception:
            self._failed()
        else:
            self._succeeded()
        # Counted from the end of the run, so a slow duty does not run back to back.
        self.next_run_at = time.monotonic() + self.delay_s

    def _failed(self) -> None:
        if self.failures == 0:
            self.failing_since = utcnow()
            log.exception("scheduler: %s failed; retrying with backoff (logged again once it recovers)", self.name)
        self.failures += 1

    def _succeeded(self) -> None:
        if self.failures:
            log.warning(
                "scheduler: %s recovered; it failed %d times since %s",
                self.name,
                self.failures,
                self.failing_since.isoformat() if self.failing_since else "?",
            )
        self.failures, self.failing_since = 0, None


def run_duties(duties: Sequence[Duty], stop: threading.Event, *, tick_s: float = TICK_S) -> None:
    """Every ``tick_s`` until ``stop`` is set: run each duty that is due."""
    while not stop.wait(tick_s):
        for duty in duties:
            if stop.is_set():
                return
            if duty.due(time.monotonic()):
                duty.run()


class Scheduler:
    """The duties over this process's own database engine, Redis client and webhook pool.

    ``tick_s`` is both the loop's tick and the interval of the every-tick duties; tests
    shorten it. ``duties`` may be added to before ``run``."""

    def __init__(self, settings: Settings, *, tick_s: float = TICK_S, resolve: Resolve = system_resolve) -> None:
        self.settings = settings
        self.tick_s = tick_s
        self._engine = sync_engine(settings.database_url)
        self._sessions = sync_sessions(self._engine)
        self._redis = Redis.from_url(settings.require_redis_url())
        warn_if_open_to_others(settings.data_dir)
        secret = load_secret(settings.webhook_secret, settings.data_dir)
        policy = DestinationPolicy.from_setting(settings.webhook_allowed_hosts, resolve=resolve)
        self._webhooks = DeliveryPool(self._sessions, secret, threads=settings.webhook_delivery_threads, policy=policy)
        # The reconciler waits one interval before its first run, as it always has: workers
        # that were running when the system restarted get time to report in again.
        later = time.monotonic() + settings.reconcile_interval_s
        self.duties = [
            Duty("aging", self.promote_aged_jobs, tick_s),
            Duty("schedules", self.fire_schedules, tick_s),
            Duty("batches", self.advance_batches, tick_s),
            Duty("webhooks", self._webhooks.dispatch, tick_s),
            Duty("reconciler", self.reconcile, settings.reconcile_interval_s, next_run_at=later),
            Duty("rollups", self.roll_up_stats, settings.reconcile_interval_s, next_run_at=later),
        ]

    def run(self, stop: threading.Event) -> None:
        run_duties(self.duties, stop, tick_s=self.tick_s)

    def close(self) -> None:
        self._webhooks.close()
        self._redis.close()
        self._engine.dispose()

    # ------------------------------------------------------------ the duties

    def promote_aged_jobs(self) -> None:
        promote_aged_jobs(self._redis, aging_s=self.settings.priority_aging_s)

    def fire_schedules(self) -> None:
        with self._sessions() as session:
            fire_due_schedules(
                session,
                self._redis,
                timeout_s=self.settings.job_timeout_s,
                worker_slots=self.settings.worker_slots,
                planning=Planning.of(self.settings),
            )

    def advance_batches(self) -> None:
        with self._sessions() as session:
            advance_batches(session, self._redis, self.settings.data_dir)

    def reconcile(self) -> None:
        with self._sessions() as session:
            reconcile_once(
                session,
                self._redis,
                grace_s=self.settings.reconcile_grace_s,
                max_attempts=self.settings.job_max_attempts,
                timeout_s=self.settings.job_timeout_s,
                orphan_limit_s=self.settings.worker_ttl_s,
                redis_settle_s=self.settings.worker_ttl_s,
                spool_dir=outcome_spool.spool_dir(self.settings.data_dir),
            )

    def roll_up_stats(self) -> None:
        with self._sessions() as session:
            rollups.refresh(session)


def run_scheduler(settings: Settings, stop: threading.Event) -> None:
    """Run the scheduler until ``stop`` is set. Safe to run in several processes at once."""
    scheduler = Scheduler(settings)
    try:
        scheduler.run(stop)
    finally:
        scheduler.close()
