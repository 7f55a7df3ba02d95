"""gpuq on one machine with embedded defaults: SQLite, a private Redis, the bundled model,
the supervisor (one worker per GPU, or CPU workers), the scheduler loop and the API,
started and stopped together by ``gpuq up``.

They stop together however ``gpuq up`` is stopped: Ctrl-C and SIGTERM run the same
shutdown (the supervisor drains its workers, then Redis stops), and a ``gpuq up`` killed
outright takes its children with it (``gpuq.children``). One data directory serves one
``gpuq up`` at a time (``gpuq.local.data_lock``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType

from gpuq.auth.admin_key import ensure_admin_key, key_file, read_key_file
from gpuq.children import spawn_child
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.local.data_lock import data_dir_lock
from gpuq.local.redis_server import PrivateRedis
from gpuq.registry.models import register_bundled_model
from gpuq.scheduler import run_scheduler
from gpuq.settings import ENV_PREFIX, Settings

log = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT_S = 30


def prepare_database(settings: Settings) -> str | None:
    """Bring the schema to the latest migration, register the bundled model, and create the
    first admin key if there is none (returned, to be shown once)."""
    migrate.upgrade(settings.database_url)
    engine = sync_engine(settings.database_url)
    with sync_sessions(engine)() as session:
        if settings.register_bundled_model:
            register_bundled_model(session)
        new_key = ensure_admin_key(session, settings.data_dir)
    engine.dispose()
    return new_key


def spawn_supervisor(
    settings: Settings, *, cpu_workers: int, inherit_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """The supervisor in its own process, with the settings this process resolved passed down."""
    env = {**os.environ, **settings_env(settings)}
    args = [sys.executable, "-m", "gpuq.cli", "supervisor", "--cpu-workers", str(cpu_workers)]
    return spawn_child(args, env=env, pass_fds=inherit_fds)


def settings_env(settings: Settings) -> dict[str, str]:
    return {
        f"{ENV_PREFIX}DATABASE_URL": settings.database_url,
        f"{ENV_PREFIX}REDIS_URL": settings.redis_url,
        f"{ENV_PREFIX}DATA_DIR": str(settings.data_dir),
    }


@dataclass
class EmbeddedSystem:
    settings: Settings
    supervisor: subprocess.Popen[bytes] | None = None
    admin_key: str | None = None  # the first admin key, when this start created it

    @property
    def api_key(self) -> str | None:
        """A key for this system's own clients (demo, run-batch): the one just created or saved."""
        return self.admin_key or read_key_file(self.settings.data_dir)


@contextmanager
def embedded_system(settings: Settings, *, workers: int = 1) -> Iterator[EmbeddedSystem]:
    """Everything but the API: Redis (private unless GPUQ_REDIS_URL is set), schema, the
    supervisor and its workers (``workers`` CPU workers on a host without GPUs), the
    scheduler loop. Stops them in reverse order on exit, on SIGTERM as on Ctrl-C.

    Raises DataDirInUse if another gpuq runs on the same data directory."""
    with data_dir_lock(settings.data_dir) as lock_fd, _sigterm_as_exit():
        yield from _run_embedded(settings, workers=workers, lock_fd=lock_fd)


def _run_embedded(settings: Settings, *, workers: int, lock_fd: int) -> Iterator[EmbeddedSystem]:
    private = (
        PrivateRedis(settings.data_dir / "redis", inherit_fds=(lock_fd,)) if settings.uses_embedded_redis else None
    )
    if private is not None:
        settings = settings.model_copy(update={"redis_url": private.start()})
        log.info("private Redis at %s", settings.redis_url)
    stop = threading.Event()
    system = EmbeddedSystem(settings)
    scheduler = threading.Thread(target=run_scheduler, args=(settings, stop), name="scheduler", daemon=True)
    try:
        system.admin_key = prepare_database(settings)
        _announce_admin_key(system.admin_key, settings)
        system.supervisor = spawn_supervisor(settings, cpu_workers=workers, inherit_fds=(lock_fd,))
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


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit, so the shutdown in ``finally`` runs as it does for Ctrl-C.

    Without it SIGTERM's default action ends the process on the spot, leaving the
    supervisor, its workers and Redis running. (uvicorn catches SIGTERM while it serves,
    then restores this handler and raises the signal again once it has shut down.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _announce_admin_key(new_key: str | None, settings: Settings) -> None:
    where = key_file(settings.data_dir)
    if new_key is not None:
        print(
            f"\nCreated the first admin API key (shown once; also saved to {where}, mode 600):\n\n    {new_key}\n\n"
            "Send it as `Authorization: Bearer <key>`. CLI commands on this machine read it from that file.\n",
            flush=True,
        )
    elif where.is_file():
        log.info("admin API key: in %s", where)
