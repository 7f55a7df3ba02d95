"""gpuq on one machine with embedded defaults: SQLite, a private Redis, the bundled model,
the supervisor (one worker per GPU, or CPU workers), the scheduler loop and the API,
started and stopped together by ``gpuq up``.

They stop together however ``gpuq up`` is stopped: Ctrl-C and SIGTERM run the same
shutdown (the supervisor drains its workers, then Redis stops), and a ``gpuq up`` killed
outright takes its children with it (``gpuq.children``). A supervisor that dies on its own
(the OOM killer, a crash) is started again with a backoff (``SupervisorKeeper``). One data
directory serves one ``gpuq up`` at a time (``gpuq.local.data_lock``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType

from gpuq.auth.admin_key import ensure_admin_key, key_file, read_key_file
from gpuq.children import spawn_child
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.local.data_lock import data_dir_lock
from gpuq.local.redis_server import PrivateRedis
from gpuq.registry.models import register_bundled_model, register_second_model
from gpuq.scheduler import run_scheduler
from gpuq.settings import ENV_PREFIX, Settings

log = logging.getLogger(__name__)

# How long a stop waits for the supervisor: its drain lets running jobs finish for up to
# DRAIN_TIMEOUT_S (worker/supervisor.py, 10 minutes) before it kills them; the margin is for
# its own exit. Killing it sooner sent its workers their death signal mid-drain.
SUPERVISOR_STOP_TIMEOUT_S = 630.0
RESTART_BACKOFF_START_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
RESTART_STABLE_AFTER_S = 60.0  # a supervisor that ran this long starts its backoff afresh
WATCH_INTERVAL_S = 0.5


def prepare_database(settings: Settings) -> str | None:
    """Bring the schema to the latest migration, register the bundled model, and create the
    first admin key if there is none (returned, to be shown once)."""
    migrate.upgrade(settings.database_url)
    engine = sync_engine(settings.database_url)
    with sync_sessions(engine)() as session:
        if settings.register_bundled_model:
            register_bundled_model(session)
        if settings.register_second_model:
            register_second_model(session, settings.data_dir / "models")
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


def restart_delay_s(failures: int) -> float:
    """The wait before the supervisor's next start after ``failures`` deaths in a row: 1 s
    doubling to a minute, the exponent capped so no count of deaths overflows it."""
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_START_S * 2 ** min(failures, 16))


class SupervisorKeeper:
    """The supervisor of ``gpuq up``, started again whenever it dies (a signal or a non-zero
    exit status; an exit 0 is a stop it was asked for).

    Without it a supervisor killed by the OOM killer (or crashing) left ``gpuq up`` serving
    an API whose jobs were accepted and never run. Its watch thread is the restarted
    supervisor's parent thread for the kernel's death signal (``gpuq.children``), so it
    lives until ``stop``."""

    def __init__(self, spawn: Callable[[], subprocess.Popen[bytes]]) -> None:
        self._spawn = spawn
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart and a stop never cross
        self.process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._watch, name="supervisor-keeper", daemon=True)

    def start(self) -> None:
        self.process = self._spawn()
        self._thread.start()

    def _watch(self) -> None:
        failures, started = 0, time.monotonic()
        while not self._stopping.wait(WATCH_INTERVAL_S):
            process = self.process
            if process is None or process.poll() is None:
                continue
            if process.returncode == 0:
                # It was told to stop and drained its workers: the signal was meant for all of
                # gpuq up (Ctrl-C reaches the whole process group), or someone stopped it.
                log.warning("the supervisor (pid %d) stopped; not starting it again", process.pid)
                return
            if time.monotonic() - started >= RESTART_STABLE_AFTER_S:
                failures = 0
            delay = restart_delay_s(failures)
            failures += 1
            log.error(
                "the supervisor (pid %d) exited (%s); starting it again in %.0f s",
                process.pid,
                _exit_status(process.returncode),
                delay,
            )
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self.process = self._spawn()
                except OSError:
                    log.exception("starting the supervisor again failed; will retry")
                    continue
                started = time.monotonic()
            log.warning("the supervisor started again (pid %d)", self.process.pid)

    def stop(self, timeout_s: float = SUPERVISOR_STOP_TIMEOUT_S) -> None:
        """SIGTERM to the supervisor (it drains its workers: running jobs finish first), waiting
        up to ``timeout_s`` before killing it."""
        with self._lock:
            self._stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout_s)
            if process.poll() is None:
                process.kill()
                process.wait()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        with suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


@dataclass
class EmbeddedSystem:
    settings: Settings
    supervisor: SupervisorKeeper | None = None
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
        system.supervisor = SupervisorKeeper(
            lambda: spawn_supervisor(settings, cpu_workers=workers, inherit_fds=(lock_fd,))
        )
        system.supervisor.start()
        scheduler.start()
        yield system
    finally:
        stop.set()
        if system.supervisor is not None:
            system.supervisor.stop()  # it drains its workers: running jobs finish first
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
