"""The data directory's disk: full (a small tmpfs mounted for the test, as root), and an API
killed while it stores an upload."""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from rq.registry import FailedJobRegistry

from gpuq.batches.files import STALE_UPLOAD_S
from gpuq.queue_names import Priority, queue_name
from gpuq.testing import GpuqProcesses
from tests.e2e.conftest import wait_until

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


def _batch(lines: int, pad: int) -> bytes:
    body = {"model": MODEL, "prompt": "x" * pad, "max_tokens": 4}
    rows = (
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body})
        for i in range(lines)
    )
    return ("\n".join(rows) + "\n").encode()


def _files(processes: GpuqProcesses, url: str) -> list[dict]:
    headers = {"authorization": f"Bearer {processes.admin_key}"}
    return httpx.get(f"{url}/v1/files", headers=headers, timeout=30).json()["data"]


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_upload_to_a_full_disk_is_a_507_saying_so_and_leaves_nothing(tmp_path, database_url, redis_url, small_disk):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    processes.settings |= {"GPUQ_DATA_DIR": str(small_disk / "data")}
    try:
        _api, url = processes.start_api()
        upload = httpx.post(
            f"{url}/v1/files",
            headers={"authorization": f"Bearer {processes.admin_key}"},
            files={"file": ("big.jsonl", _batch(6000, 1000))},  # about 6 MB on a 4 MB disk
            data={"purpose": "batch"},
            timeout=60,
        )
        files = _files(processes, url)
    finally:
        processes.stop_all()
    assert upload.status_code == 507, upload.text
    assert "disk is full" in upload.json()["error"]["message"]
    assert files == []
    assert list((small_disk / "data" / "files").iterdir()) == []  # no .part, no file


def test_an_upload_left_unfinished_by_a_killed_api_is_removed_at_the_next_start(tmp_path, database_url, redis_url):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    files_dir = tmp_path / "files"
    try:
        api, url = processes.start_api()
        payload = _batch(40_000, 300)  # about 14 MB: checked line by line, it takes a while to store
        admin_key = processes.admin_key

        def upload() -> None:
            with contextlib.suppress(httpx.TransportError):  # the API is killed under it
                httpx.post(
                    f"{url}/v1/files",
                    headers={"authorization": f"Bearer {admin_key}"},
                    files={"file": ("big.jsonl", payload)},
                    data={"purpose": "batch"},
                    timeout=120,
                )

        sender = threading.Thread(target=upload)
        sender.start()
        wait_until(
            lambda: any(p.stat().st_size for p in files_dir.glob(".file-*.part")), "the upload was never stored", 120
        )
        os.kill(api.popen.pid, signal.SIGKILL)  # mid-store, as an OOM kill
        api.popen.wait()
        sender.join(timeout=60)
        [left] = list(files_dir.glob(".file-*.part"))
        size_left = left.stat().st_size
        # No writer is left: after STALE_UPLOAD_S untouched it is stale (aged here, not waited for).
        old = time.time() - STALE_UPLOAD_S - 1
        os.utime(left, (old, old))
        _api, url = processes.start_api()
        after = list(files_dir.glob(".file-*.part"))
        files = _files(processes, url)
    finally:
        processes.stop_all()
    assert size_left > 0
    assert after == [] and files == []


def _fill(path: Path) -> None:
    """Writes ``path`` until the disk under it is full."""
    # Unbuffered, and the error suppressed outside the file: closing a buffered file on a full
    # disk flushes, and raises again.
    with contextlib.suppress(OSError), path.open("wb", buffering=0) as filler:
        while True:
            filler.write(b"\0" * 65536)
            filler.flush()


def test_readyz_says_not_ready_while_the_data_directorys_disk_is_full(tmp_path, database_url, redis_url, small_disk):
    (tmp_path / "models").mkdir()
    processes = GpuqProcesses(database_url, redis_url, tmp_path)
    processes.settings |= {"GPUQ_DATA_DIR": str(small_disk / "data")}
    try:
        _api, url = processes.start_api()
        before = httpx.get(f"{url}/readyz", timeout=30)
        _fill(small_disk / "filler")
        full = httpx.get(f"{url}/readyz", timeout=30)
        (small_disk / "filler").unlink()
        after = httpx.get(f"{url}/readyz", timeout=30)
    finally:
        processes.stop_all()
    assert (before.status_code, before.json()["disk"]) == (200, "ok")
    assert full.status_code == 503 and full.headers["retry-after"]
    assert full.json()["status"] == "unavailable"
    assert full.json()["disk"].startswith("full: ") and "uploads and writes there fail" in full.json()["disk"]
    assert (after.status_code, after.json()["disk"]) == (200, "ok")


def test_a_worker_whose_claims_fail_on_a_full_disk_backs_off_instead_of_retrying_at_once(
    tmp_path, database_url, redis_url, small_disk
):
    """SQLite on a full disk reads (the worker's model list) but cannot write (its claims). A
    read that answers used to clear the claims' backoff, so the worker retried its claim on
    every wake-up; only a claim that succeeds clears it now."""
    (tmp_path / "models").mkdir()
    on_small_disk = small_disk / "gpuq.db"
    on_small_disk.write_bytes(Path(database_url.removeprefix("sqlite:///")).read_bytes())
    processes = GpuqProcesses(f"sqlite:///{on_small_disk}", redis_url, tmp_path)
    processes.settings |= {"GPUQ_WORKER_REFRESH_INTERVAL_S": "0.2"}
    try:
        _api, url = processes.start_api()
        with processes.client(url) as client:
            ids = [client.submit(NOOP)["id"] for _ in range(4)]
            _fill(small_disk / "filler")
            worker, _name = processes.start_worker()
            time.sleep(8)  # a few claims fail meanwhile, each after a longer wait
            full_log = worker.log.read_text()
            (small_disk / "filler").unlink()
            done = [client.wait(i, timeout_s=60) for i in ids]
        with Redis.from_url(redis_url) as redis:
            failed = FailedJobRegistry(
                queue_name(MODEL, "noop", Priority.NORMAL, "admin"), connection=redis
            ).get_job_ids()
    finally:
        processes.stop_all()
    assert "the database is unreachable (claiming job_" in full_log  # the fault happened
    assert "the database answers again" not in full_log  # nothing took a read for a claim's success
    assert [(j["status"], j["attempts"]) for j in done] == [("succeeded", 1)] * 4
    assert failed == []  # handed back to their queue each time, never failed in RQ
