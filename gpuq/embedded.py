"""gpuq on one machine with embedded defaults: SQLite, a private Redis, the bundled model,
the supervisor (one worker per GPU, or CPU workers), the scheduler loop and the API,
started and stopped together by ``gpuq up``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from redis import Redis

from gpuq import migrate
from gpuq.aging import promote_aged_jobs
from gpuq.batches import advance_batches
from gpuq.db import sync_engine, sync_sessions
from gpuq.reconciler import reconcile_once
from gpuq.redis_server import PrivateRedis
from gpuq.registry import register_bundled_model
from gpuq.schedules import fire_due_schedules
from gpuq.settings import ENV_PREFIX, Settings
from gpuq.webhooks import deliver_due, load_secret

log = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT_S = 30
SCHEDULER_TICK_S = 1.0


def prepare_database(settings: Settings) -> None:
    """Bring the schema to the latest migration and register the bundled model."""
    migrate.upgrade(settings.database_url)
    if settings.register_bundled_model:
        engine = sync_engine(settings.database_url)
        with sync_sessions(engine)() as session:
            register_bundled_model(session)
        engine.dispose()


def spawn_supervisor(settings: Settings, *, cpu_workers: int) -> subprocess.Popen[bytes]:
    """The supervisor in its own process, with the settings this process resolved passed down."""
    env = {**os.environ, **settings_env(settings)}
    args = [sys.executable, "-m", "gpuq.cli", "supervisor", "--cpu-workers", str(cpu_workers)]
    return subprocess.Popen(args, env=env)


def settings_env(settings: Settings) -> dict[str, str]:
    return {
        f"{ENV_PREFIX}DATABASE_URL": settings.database_url,
        f"{ENV_PREFIX}REDIS_URL": settings.redis_url,
        f"{ENV_PREFIX}DATA_DIR": str(settings.data_dir),
    }


def run_scheduler(settings: Settings, stop: threading.Event) -> None:
    """The scheduler loop. Every tick: cron schedules, priority aging, batch progress
    (expiry, finalisation) and webhook deliveries; every ``reconcile_interval_s``: the
    SQL-to-Redis reconciler. Safe to run in several processes at once."""
    engine = sync_engine(settings.database_url)
    sessions = sync_sessions(engine)
    redis = Redis.from_url(settings.require_redis_url())
    webhook_secret = load_secret(settings.webhook_secret, settings.data_dir)
    next_reconcile = time.monotonic() + settings.reconcile_interval_s
    while not stop.wait(SCHEDULER_TICK_S):
        try:
            promote_aged_jobs(redis, aging_s=settings.priority_aging_s)
            with sessions() as session:
                fire_due_schedules(session, redis, timeout_s=settings.job_timeout_s)
                advance_batches(session, redis, settings.data_dir)
                deliver_due(session, webhook_secret)
            if time.monotonic() >= next_reconcile:
                next_reconcile = time.monotonic() + settings.reconcile_interval_s
                with sessions() as session:
                    reconcile_once(
                        session,
                        redis,
                        grace_s=settings.reconcile_grace_s,
                        max_attempts=settings.job_max_attempts,
                        timeout_s=settings.job_timeout_s,
                    )
        except Exception:
            log.exception("scheduler pass failed; will retry")
    redis.close()
    engine.dispose()


@dataclass
class EmbeddedSystem:
    settings: Settings
    supervisor: subprocess.Popen[bytes] | None = None


@contextmanager
def embedded_system(settings: Settings, *, workers: int = 1) -> Iterator[EmbeddedSystem]:
    """Everything but the API: Redis (private unless GPUQ_REDIS_URL is set), schema, the
    supervisor and its workers (``workers`` CPU workers on a host without GPUs), the
    scheduler loop. Stops them in reverse order on exit."""
    private = PrivateRedis(settings.data_dir / "redis") if settings.uses_embedded_redis else None
    if private is not None:
        settings = settings.model_copy(update={"redis_url": private.start()})
        log.info("private Redis at %s", settings.redis_url)
    stop = threading.Event()
    system = EmbeddedSystem(settings)
    scheduler = threading.Thread(target=run_scheduler, args=(settings, stop), name="scheduler", daemon=True)
    try:
        prepare_database(settings)
        system.supervisor = spawn_supervisor(settings, cpu_workers=workers)
        scheduler.start()
        yield system
    finally:
        stop.set()
        if system.supervisor is not None:
            system.supervisor.terminate()  # it drains its workers: running jobs finish first
            with suppress(subprocess.TimeoutExpired):
                system.supervisor.wait(timeout=WORKER_STOP_TIMEOUT_S)
            if system.supervisor.poll() is None:
                system.supervisor.kill()
        if scheduler.is_alive():
            scheduler.join(timeout=5)
        if private is not None:
            private.stop()
