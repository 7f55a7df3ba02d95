"""A small synchronous client for gpuq's HTTP API, used by the CLI, the demo and benchmarks."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

FINAL = {"succeeded", "failed", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"


class ApiError(Exception):
    """A refusal: its status and the API's ``detail``; ``retry_after`` (seconds) when it said
    when trying again can succeed (a 429's or 503's ``Retry-After``)."""

    def __init__(self, status: int, detail: str, *, retry_after: int | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after

    @classmethod
    def of(cls, response: httpx.Response) -> ApiError:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        retry_after = response.headers.get("retry-after", "")
        return cls(response.status_code, str(detail), retry_after=int(retry_after) if retry_after.isdigit() else None)


class ChatStream:
    """The pieces of text of one streamed chat completion, and its job."""

    def __init__(self, response: httpx.Response) -> None:
        self.job_id = response.headers.get("x-gpuq-job-id", "")
        self.finish_reason: str | None = None
        self._response = response

    def __iter__(self) -> Iterator[str]:
        for line in self._response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise ApiError(500, chunk["error"]["message"])
            for choice in chunk.get("choices", []):
                self.finish_reason = choice.get("finish_reason") or self.finish_reason
                if choice["delta"].get("content"):
                    yield choice["delta"]["content"]


class GpuqClient:
    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpuqClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError.of(response)
        return None if response.status_code == 204 else response.json()

    def submit(self, job: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=job)

    def submit_many(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._call("POST", "/v1/jobs/bulk", json={"jobs": jobs})["data"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self, **filters: Any) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        return self._call("GET", "/v1/jobs", params=params)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    @contextmanager
    def stream_chat(
        self, body: dict[str, Any], *, priority: str | None = None, deadline: datetime | None = None
    ) -> Iterator[ChatStream]:
        """A streamed chat completion (``/v1/chat/completions``, OpenAI's server-sent events):
        its job id at once, then its text as the worker samples it. Leaving the block early
        closes the connection, which cancels the job."""
        headers = {"X-Gpuq-Priority": priority} if priority else {}
        if deadline is not None:
            headers["X-Gpuq-Deadline"] = deadline.isoformat()
        with self._http.stream(
            "POST", "/v1/chat/completions", json=body | {"stream": True}, headers=headers, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError.of(response)
            yield ChatStream(response)

    # Admin actions (gpuq/job_actions.py, gpuq/workers.py); retry and the bulk forms are also for owners.

    def retry(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/retry")

    def requeue(self, job_id: str) -> dict[str, Any]:
        """``{"job": ..., "action": "what was done"}``."""
        return self._call("POST", f"/v1/jobs/{job_id}/requeue")

    def retry_jobs(self, **selection: Any) -> dict[str, int]:
        """``{"matched", "changed"}`` for the jobs selected (status, model, kind, priority, owner, created_*)."""
        return self._call("POST", "/v1/jobs/retry", json=selection)

    def workers(self) -> dict[str, Any]:
        return self._call("GET", "/v1/workers")

    def events(self, **filters: Any) -> dict[str, Any]:
        """Worker and GPU events, newest first (``kind`` may be a list)."""
        params = {k: v for k, v in filters.items() if v is not None}
        return self._call("GET", "/v1/events", params=params)

    def drain(self, worker: str, *, undo: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/v1/workers/{worker}/{'undrain' if undo else 'drain'}")

    def drain_host(self, host: str, *, undo: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/v1/hosts/{host}/{'undrain' if undo else 'drain'}")

    def unload(self, model: str, *, worker: str | None = None) -> dict[str, Any]:
        """From every worker holding it, or from one."""
        if worker is not None:
            return self._call("POST", f"/v1/workers/{worker}/unload", json={"model": model})
        return self._call("POST", f"/v1/models/{model}/unload")

    def clear_gpu(self, uuid: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/gpus/{uuid}/clear")

    def models(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/models")["data"]

    def register_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/models", json=body)

    def set_alias(self, alias: str, model: str) -> dict[str, Any]:
        return self._call("PUT", f"/v1/model-aliases/{alias}", json={"model": model})

    def delete_alias(self, alias: str) -> None:
        self._call("DELETE", f"/v1/model-aliases/{alias}")

    def gpus(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/gpus")["data"]

    def rules(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/affinity-rules")["data"]

    def add_rule(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/affinity-rules", json=body)

    def cancel_jobs_of_key(self, key_id: str) -> None:
        """Revoke a key (if it is not yet) and cancel every queued or running job it submitted."""
        response = self._http.delete(f"/v1/keys/{key_id}", params={"cancel_jobs": "true"})
        if response.status_code >= 400:
            raise ApiError.of(response)

    def delete_rule(self, rule_id: int) -> None:
        response = self._http.delete(f"/v1/affinity-rules/{rule_id}")
        if response.status_code >= 400:
            raise ApiError.of(response)

    def preview(self, model: str, kind: str = "generate") -> dict[str, Any]:
        return self._call("GET", "/v1/affinity-rules/preview", params={"model": model, "kind": kind})

    def upload(self, path: str) -> dict[str, Any]:
        with open(path, "rb") as f:
            return self._call("POST", "/v1/files", files={"file": (Path(path).name, f)}, data={"purpose": "batch"})

    def create_batch(
        self, file_id: str, *, endpoint: str, priority: str = "low", completion_window: str = "24h"
    ) -> dict[str, Any]:
        body = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
            "priority": priority,
        }
        return self._call("POST", "/v1/batches", json=body)

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{batch_id}")

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/batches/{batch_id}/cancel")

    def batch_results(self, batch_id: str) -> str:
        """Output and error lines answered so far (all of them once the batch is done)."""
        response = self._http.get(f"/v1/batches/{batch_id}/results")
        if response.status_code >= 400:
            raise ApiError.of(response)
        return response.text

    def schedules(self, method: str = "GET", path: str = "", **kwargs: Any) -> Any:
        """The /v1/schedules API: ``schedules()`` lists, ``schedules("POST", json=...)`` creates,
        ``schedules("POST", "/3/run")`` runs schedule 3 now, and so on."""
        return self._call(method, f"/v1/schedules{path}", **kwargs)

    def wait(self, job_id: str, *, timeout_s: float = 600.0) -> dict[str, Any]:
        """Poll until the job is final; back off from 50 ms to 1 s between polls."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            job = self.job(job_id)
            if job["status"] in FINAL:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def wait_ready(self, *, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with suppress(httpx.TransportError):  # not listening yet: try again below
                if self._http.get("/readyz").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"gpuq API at {self._http.base_url} not ready after {timeout_s:.0f} s")
            time.sleep(0.1)
