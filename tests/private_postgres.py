"""A PostgreSQL server of the test's own, on a spare port, to stop and start for outages.

The machine's PostgreSQL serves every other test, so outages are caused on a private
instance: ``initdb`` into a temporary directory, then ``pg_ctl`` to start and stop it
(``fast`` shutdown: connections are cut, as when a database host goes away). As root, the
server runs as the ``postgres`` user, because PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from gpuq.local.redis_server import free_port

START_TIMEOUT_S = 30.0


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        if not candidates:
            raise FileNotFoundError(f"{name} is not installed: the outage tests need PostgreSQL's server binaries")
        found = str(candidates[-1])
    return found


class PrivatePostgres:
    """In a directory of its own under the system's temporary folder (pytest's are private
    to root, where the ``postgres`` user cannot go); ``remove()`` deletes it."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="gpuq-test-postgres-"))
        self.data = self.directory / "pgdata"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = ["runuser", "-u", "postgres", "--", *args] if self._as_postgres else list(args)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> PrivatePostgres:
        if self._as_postgres:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run(_binary("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off"
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.directory / "log"), "start")
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=1).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
