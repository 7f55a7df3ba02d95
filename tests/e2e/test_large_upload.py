"""A 200 MB, 50,000-line batch file is streamed to disk, never held whole in the API's memory."""

import json
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

LINES = 50_000
LINE_BYTES = 4_000  # 50,000 x 4 kB = 200 MB


def peak_rss_mib(pid: int) -> float:
    """The process's high-water mark of resident memory (VmHWM), in MiB."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


def write_big_file(path: Path) -> int:
    filler = "x" * LINE_BYTES
    with path.open("w") as f:
        for i in range(LINES):
            body = {"model": "smollm2-135m", "input": filler[: LINE_BYTES - 120]}
            f.write(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")
    return path.stat().st_size


def test_a_200_mb_upload_is_streamed_and_stored_whole(processes, tmp_path):
    api, url = processes.start_api()
    path = tmp_path / "big.jsonl"
    size = write_big_file(path)
    assert size >= 190 * 1024 * 1024
    before = peak_rss_mib(api.popen.pid)
    with path.open("rb") as f, httpx.Client(base_url=url, timeout=300) as http:
        response = http.post(
            "/v1/files",
            files={"file": (path.name, f)},
            data={"purpose": "batch"},
            headers={"Authorization": f"Bearer {processes.admin_key}"},
        )
    assert response.status_code == 200, response.text
    file = response.json()
    assert file["bytes"] == size
    growth = peak_rss_mib(api.popen.pid) - before
    # Streaming keeps the peak to buffers (1 MiB chunks, the multipart spool); holding the
    # file would add at least its 200 MB.
    assert growth < 64, f"the API's peak memory grew by {growth:.0f} MiB for a {size >> 20} MiB upload"
    stored = next((processes.workdir / "files").glob(f"{file['id']}*"))
    assert stored.read_bytes() == path.read_bytes()
