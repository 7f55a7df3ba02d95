"""Anthropic's message object, made from a finished generation job's row.

The answer of ``POST /v1/messages`` and of a Message Batch's ``succeeded`` result (whose
request gpuq/batches/anthropic_format.py read), and the pieces its stream is made of
(gpuq/dropin/anthropic.py): content blocks (``text``; with tools offered, the calls read from
the text as ``tool_use`` blocks), the stop reason (``end_turn``, ``max_tokens``,
``stop_sequence`` with the stop string the worker recorded, ``tool_use``) and the usage,
the prompt's cached tokens apart from those evaluated, as Anthropic counts them.
"""

from __future__ import annotations

from typing import Any

from gpuq.db.tables import Job
from gpuq.jobs import tool_calls

STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def message_id(job_id: str) -> str:
    """A message's id names its job (``msg_<job id>``): GET /v1/jobs/{id} and the dashboard show it."""
    return f"msg_{job_id}"


def usage(prompt: int | None, completion: int | None, cached: int | None) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` are the prompt's tokens evaluated, beside those read
    from the worker's cache (``cache_read_input_tokens``); gpuq writes no billed cache entries."""
    cached = cached or 0
    return {
        "input_tokens": max(0, (prompt or 0) - cached),
        "output_tokens": completion or 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def content(job: Job, text: str, finish: str | None, stop: str | None) -> tuple[list[dict[str, Any]], str, str | None]:
    """A finished answer's content blocks, stop reason and stop sequence: with tools offered,
    the calls read from its text as ``tool_use`` blocks (ids from the job's, stable across
    readings) and stop reason ``tool_use``."""
    tools = (job.request or {}).get("tools")
    if tools:
        rest, calls = tool_calls.parse(text, tools, parallel=tool_calls.parallel(job.request))
        if calls:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": rest}] if rest else []
            blocks += [
                {"type": "tool_use", "id": f"toolu_{job.id}_{i}", "name": call.name, "input": call.arguments}
                for i, call in enumerate(calls)
            ]
            return blocks, "tool_use", None
    plain: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if stop is not None:
        return plain, "stop_sequence", stop
    return plain, STOP_REASONS.get(finish or "stop", "end_turn"), None


def message(job: Job) -> dict[str, Any]:
    """The message object of a finished job."""
    result = job.result or {}
    blocks, reason, stop = content(
        job, str(result.get("text", "")), result.get("finish_reason"), result.get("stop_sequence")
    )
    return {
        "id": message_id(job.id),
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": stop,
        "usage": usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens),
    }


def error(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error object (the body of every refusal on its routes)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def batch_result(job: Job, custom_id: str, *, expired: bool) -> tuple[bool, dict[str, Any]]:
    """(succeeded, a Message Batch's result line) for one finished request."""
    if job.status == "succeeded":
        result: dict[str, Any] = {"type": "succeeded", "message": message(job)}
    elif job.status == "cancelled":
        result = {"type": "expired" if expired else "canceled"}
    else:
        result = {"type": "errored", "error": error("api_error", job.error or "the job failed")}
    return job.status == "succeeded", {"custom_id": custom_id, "result": result}
