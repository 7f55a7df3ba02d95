"""`gpuq up` on one data directory: stopped by SIGTERM or killed outright, it leaves no
process behind, and a second one cannot start beside it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from gpuq.local.redis_server import free_port
from tests.e2e.conftest import wait_until


def _descendants(pid: int) -> set[int]:
    """Every live process below pid, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # a zombie has exited already
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _env(data_dir: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")},
        "GPUQ_DATA_DIR": str(data_dir),
        "GPUQ_WORKER_THREADS": "1",
    }


def _up(data_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli", "up", "--port", str(port)],
        env=_env(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _started(up: subprocess.Popen[str], port: int) -> set[int]:
    """Waits until the API answers and the worker runs; returns the processes below `gpuq up`."""

    def serving() -> bool:
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(serving, "gpuq up never served", timeout_s=120)
    wait_until(lambda: len(_descendants(up.pid)) >= 3, "gpuq up never started Redis, the supervisor and a worker")
    return _descendants(up.pid)


def test_gpuq_up_is_alone_on_its_data_directory_and_leaves_nothing_behind(tmp_path):
    data_dir = tmp_path / "data"
    first_port, second_port, third_port = free_port(), free_port(), free_port()
    first = _up(data_dir, first_port)
    first_children: set[int] = set()
    try:
        first_children = _started(first, first_port)
        # Its --port is remembered in the data directory: the next command needs no --url.
        assert (data_dir / "api.url").read_text() == f"http://127.0.0.1:{first_port}\n"
        jobs = subprocess.run(
            [sys.executable, "-m", "gpuq.cli", "jobs"], env=_env(data_dir), capture_output=True, text=True, timeout=60
        )
        assert jobs.returncode == 0, jobs.stderr

        second = _up(data_dir, second_port)  # same data directory: refused, nothing started
        out, _ = second.communicate(timeout=60)
        assert second.returncode != 0
        assert f"another gpuq (pid {first.pid}) is running on the data directory" in out
        assert out.strip().splitlines()[-1].startswith("error: ")
        assert (data_dir / "api.url").read_text() == f"http://127.0.0.1:{first_port}\n"  # not the refused one's

        first.kill()  # SIGKILL: no shutdown code runs; its children are told by the kernel
        first.wait()
        wait_until(lambda: not _alive(first_children), "children outlived their killed gpuq up", timeout_s=60)

        third = _up(data_dir, third_port)  # the directory is free again
        third_children: set[int] = set()
        try:
            third_children = _started(third, third_port)
            third.send_signal(signal.SIGTERM)  # the way a service manager stops it
            third.wait(timeout=60)
            assert not _alive(third_children), "SIGTERM must stop the supervisor, its workers and Redis too"
        finally:
            for pid in _alive({third.pid, *third_children}):
                os.kill(pid, signal.SIGKILL)
    finally:  # on a failure, leave no stray process to the tests that follow
        for pid in _alive({first.pid, *first_children}):
            os.kill(pid, signal.SIGKILL)
