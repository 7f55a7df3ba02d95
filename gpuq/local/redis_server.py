"""A private redis-server for the embedded defaults, started and stopped by gpuq itself."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from gpuq.children import spawn_child
from gpuq.private_files import private_dir

START_TIMEOUT_S = 10.0


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise FileNotFoundError(
            "redis-server is not installed, and gpuq needs it to start its private Redis: "
            "install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) "
            "or set GPUQ_REDIS_URL to an existing Redis"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """redis-server on a free loopback port, with its append-only file in ``data_dir``
    so queued work survives a restart (the reconciler would rebuild it anyway). That file holds
    every tenant's streamed text, so its directory is 0700 and redis-server runs under umask
    077: the append-only files are 0600 from their creation. It gets
    SIGTERM if the process that started it dies; ``inherit_fds`` are passed on to it (the
    data directory's lock, held until this Redis has exited too)."""

    def __init__(self, data_dir: Path, *, persist: bool = True, inherit_fds: tuple[int, ...] = ()) -> None:
        self.data_dir = data_dir
        self.persist = persist
        self.inherit_fds = inherit_fds
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, port: int | None = None) -> str:
        """Starts it on a free port, or on ``port`` (to come back where clients look for it)."""
        private_dir(self.data_dir)
        self.port = port or free_port()
        args = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir.resolve()),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--logfile",
            str((self.data_dir / "redis.log").resolve()),
        ]
        # In a session of its own: a terminal's Ctrl-C reaches gpuq up's whole process group,
        # and redis-server quits at once on SIGINT, while the workers still finish their jobs
        # and the API answers its calls; gpuq up stops it last. (Its death signal still holds.)
        self._process = spawn_child(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=self.inherit_fds,
            umask=0o077,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        client = Redis.from_url(self.url)
        while True:
            try:
                client.ping()
                return self.url
            except RedisError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start; see {self.data_dir / 'redis.log'}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None
