"""A big batch's start: the API's memory and the planning time, at two sizes (issue 24 item 9).

A file of N chat lines of about 4 KB each is uploaded to a real API process, then started as a
batch (every line checked, the jobs written and queued). Reported per size: the seconds
``POST /v1/batches`` took and per 10,000 lines (planning is linear in the file if that
figure stays the same from 10,000 to 50,000 lines), and the API's resident memory before
the upload, at its peak, and after the batch is planned (target: after within 20% of
before; a start that kept the lines and jobs in memory went from 195 MB to 610 MB and
stayed there).

The baseline is the same API process warmed up by a one-line batch, so that what it loads
once (the tokenizer, SQLAlchemy's compiled statements) is in both figures.

``measure_messages`` does the same for an Anthropic Message Batch of N such requests, which
come inline in the body of ``POST /v1/messages/batches`` rather than in an uploaded file.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

LINE_BYTES = 4096
SETTLE_S = 2.0  # after the answer, before memory is read: the request's objects are freed by then


@dataclass(frozen=True)
class StartCost:
    lines: int
    seconds: float
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float

    @property
    def seconds_per_10k(self) -> float:
        return self.seconds / self.lines * 10_000

    @property
    def after_over_before(self) -> float:
        return self.rss_after_mib / self.rss_before_mib


def write_file(path: Path, lines: int) -> None:
    """``lines`` chat lines of about LINE_BYTES bytes each, every one different."""
    filler = "Tell me about the history of bread, its grains, its ovens and its markets. " * 60
    with path.open("w") as f:
        for i in range(lines):
            content = f"{i}: {filler}"[: LINE_BYTES - 200]
            body = {"model": BUNDLED_MODEL_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            f.write("\n")


def _memory_mib(pid: int) -> tuple[float, float]:
    """The process's resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def message_requests(count: int) -> list[dict]:
    """``count`` Messages requests of about LINE_BYTES bytes each, every one different."""
    filler = "Tell me about the history of bread, its grains, its ovens and its markets. " * 60
    return [
        {
            "custom_id": f"r{i}",
            "params": {
                "model": BUNDLED_MODEL_NAME,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"{i}: {filler}"[: LINE_BYTES - 200]}],
            },
        }
        for i in range(count)
    ]


def measure_messages(database_url: str, redis_url: str, workdir: Path, count: int) -> StartCost:
    processes = GpuqProcesses(database_url, redis_url, workdir)
    try:
        api, url = processes.start_api()
        auth = {"x-api-key": processes.admin_key}
        with httpx.Client(base_url=url, timeout=1800, headers=auth) as http:
            warm = http.post("/v1/messages/batches", json={"requests": message_requests(1)})
            assert warm.status_code == 200, warm.text
            time.sleep(SETTLE_S)
            before, _ = _memory_mib(api.popen.pid)
            body = json.dumps({"requests": message_requests(count)}).encode()
            started = time.perf_counter()
            batch = http.post("/v1/messages/batches", content=body, headers={"Content-Type": "application/json"})
            seconds = time.perf_counter() - started
            del body
            assert batch.status_code == 200 and batch.json()["request_counts"]["processing"] == count, batch.text
            time.sleep(SETTLE_S)
            after, peak = _memory_mib(api.popen.pid)
    finally:
        processes.stop_all()
    return StartCost(count, seconds, before, peak, after)


def _start(http: httpx.Client, path: Path) -> dict:
    with path.open("rb") as f:
        file = http.post("/v1/files", files={"file": (path.name, f)}, data={"purpose": "batch"}).json()
    return dict(http.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}).json())


def measure(database_url: str, redis_url: str, workdir: Path, lines: int) -> StartCost:
    warm, big = workdir / "warm.jsonl", workdir / f"start-{lines}.jsonl"
    write_file(warm, 1)
    write_file(big, lines)
    processes = GpuqProcesses(database_url, redis_url, workdir)
    try:
        api, url = processes.start_api()
        auth = {"Authorization": f"Bearer {processes.admin_key}"}
        with httpx.Client(base_url=url, timeout=1800, headers=auth) as http:
            assert _start(http, warm)["request_counts"]["total"] == 1
            time.sleep(SETTLE_S)
            before, _ = _memory_mib(api.popen.pid)
            with big.open("rb") as f:
                file = http.post("/v1/files", files={"file": (big.name, f)}, data={"purpose": "batch"}).json()
            started = time.perf_counter()
            batch = http.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions"})
            seconds = time.perf_counter() - started
            assert batch.status_code == 200 and batch.json()["request_counts"]["total"] == lines, batch.text
            time.sleep(SETTLE_S)
            after, peak = _memory_mib(api.popen.pid)
    finally:
        processes.stop_all()
    return StartCost(lines, seconds, before, peak, after)
