"""gpuq's processes started on this machine through the `gpuq` CLI, each logging to a file:
the API under uvicorn, workers, the supervisor and the scheduler. End-to-end tests and
benchmarks use them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from redis import Redis
from rq.worker import BaseWorker, Worker

from gpuq import store
from gpuq.children import spawn_child
from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Role
from gpuq.local.redis_server import free_port

START_TIMEOUT_S = 60.0


def _stat(path: Path) -> list[str] | None:
    """A /proc/<pid>/stat's fields after the command name (state, parent, ...); None once gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(stat)
        if fields is not None and fields[0] != "Z":  # a zombie has exited already
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (not exited, nor a zombie waiting to be reaped)."""
    return {pid for pid in pids if (fields := _stat(Path(f"/proc/{pid}/stat"))) is not None and fields[0] != "Z"}


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, and SIGKILL after ``timeout_s`` to it and every process below it. A
        supervisor killed mid-drain leaves its workers finishing their jobs (they shut down
        warm when their parent dies), and a live worker registers itself again in a Redis
        db that was flushed: the next test on that db would find it among its own."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                below = descendants(self.popen.pid)
                self.popen.kill()
                self.popen.wait()
                for pid in below:
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class GpuqProcesses:
    """Starts and stops gpuq processes sharing one database and one Redis."""

    database_url: str
    redis_url: str
    workdir: Path
    settings: dict[str, str] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    @cached_property
    def admin_key(self) -> str:
        """An admin API key in this system's database, made on first use."""
        engine = sync_engine(self.database_url)
        try:
            with sync_sessions(engine)() as session:
                _key, secret = store.create_api_key(session, name="local-processes", owner="admin", role=Role.ADMIN)
        finally:
            engine.dispose()
        return secret

    def client(self, url: str) -> GpuqClient:
        """A client of the API at ``url`` holding the admin key."""
        return GpuqClient(url, api_key=self.admin_key)

    def env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")},
            "GPUQ_DATABASE_URL": self.database_url,
            "GPUQ_REDIS_URL": self.redis_url,
            "GPUQ_DATA_DIR": str(self.workdir),
            "GPUQ_MODELS_DIR": str(self.workdir / "models"),
            # One llama.cpp thread a worker: the API, Redis and the test share the cores, and two
            # threads spinning at each step's barriers waste most of a 2-core machine's time.
            "GPUQ_WORKER_THREADS": "1",
            **self.settings,
        }

    def _spawn(self, name: str, args: list[str], settings: dict[str, str] | None = None) -> Process:
        log = self.workdir / f"{name}.log"
        handle = log.open("ab")
        env = self.env() | (settings or {})
        popen = spawn_child([sys.executable, "-m", "gpuq.cli", *args], env=env, stdout=handle, stderr=subprocess.STDOUT)
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def start_api(self) -> tuple[Process, str]:
        port = free_port()
        process = self._spawn(f"api-{port}", ["api", "--host", "127.0.0.1", "--port", str(port)])
        url = f"http://127.0.0.1:{port}"
        with GpuqClient(url) as client:
            try:
                client.wait_ready(timeout_s=START_TIMEOUT_S)
            except TimeoutError:
                raise RuntimeError(f"API did not start:\n{process.tail()}") from None
        return process, url

    def start_worker(
        self, slot: str = "cpu", *, gpus: str | None = None, models: tuple[str, ...] = ()
    ) -> tuple[Process, str]:
        """Starts a worker (pinned to ``gpus``, UUIDs, if given; serving only ``models``, if
        given) and waits until it has registered with RQ; returns its name."""
        redis = Redis.from_url(self.redis_url)
        before = {w.name for w in Worker.all(connection=redis)}
        process = self.spawn_worker(slot, gpus=gpus, models=models)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            new = {w.name for w in Worker.all(connection=redis)} - before
            if new:
                redis.close()
                return process, new.pop()
            if process.popen.poll() is not None:
                break
            time.sleep(0.1)
        redis.close()
        raise RuntimeError(f"worker did not start:\n{process.tail()}")

    def spawn_worker(self, slot: str = "cpu", *, gpus: str | None = None, models: tuple[str, ...] = ()) -> Process:
        """Starts a worker without waiting for it."""
        args = ["worker", "--slot", slot] + (["--gpus", gpus] if gpus else [])
        args += [arg for model in models for arg in ("--model", model)]
        return self._spawn(f"worker-{slot}-{len(self.processes)}", args)

    def start_supervisor(
        self, *, expected_workers: int, settings: dict[str, str] | None = None
    ) -> tuple[Process, list[BaseWorker]]:
        """Starts a supervisor (with ``settings`` added to this system's, e.g. its own host
        label and GPU inventory) and waits until ``expected_workers`` workers, all hosts'
        together, have registered with RQ."""
        redis = Redis.from_url(self.redis_url)
        process = self.spawn_supervisor(settings)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                workers = Worker.all(connection=redis)
                if len(workers) >= expected_workers:
                    return process, workers
                if process.popen.poll() is not None:
                    break
                time.sleep(0.2)
        finally:
            redis.close()
        raise RuntimeError(f"supervisor did not start {expected_workers} workers:\n{process.tail()}")

    def spawn_supervisor(self, settings: dict[str, str] | None = None) -> Process:
        """A supervisor, not waited for (Redis or the database may be down)."""
        return self._spawn(f"supervisor-{len(self.processes)}", ["supervisor"], settings)

    def start_scheduler(self) -> Process:
        return self._spawn(f"scheduler-{len(self.processes)}", ["scheduler"])

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def logs(self) -> str:
        return "\n\n".join(f"== {p.name} ==\n{p.tail()}" for p in self.processes)
