"""OpenAI's wire format for a call's answer: the response object, or server-sent events.

Streams are OpenAI's: ``chat.completion.chunk`` (or ``text_completion``) objects as
``data:`` lines, the first chat chunk carrying the role, each later one a ``delta`` of
text, the last one the ``finish_reason``; with ``stream_options.include_usage`` every chunk
has ``usage: null`` and one more chunk with no choices carries the usage; then
``data: [DONE]``. A job that fails or is cancelled ends the stream with OpenAI's error
object (``data: {"error": {...}}``), which the openai client raises.

When a chat call offers tools, its text is held until the end: only the whole reply says
whether it is a call. Then it goes out as one ``tool_calls`` delta (each call whole, with
its ``index``, as the openai client assembles them) and finish reason ``tool_calls``, or as
one text delta if it is not a call (vLLM and llama.cpp's server stream calls as they parse
them; holding is simpler, and the reply is the same).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from gpuq.batches.openai_format import CHAT, EMBEDDINGS, chat_choice, response_body, token_usage
from gpuq.db.tables import Job, JobStatus
from gpuq.dropin.vectors import as_base64, shortened
from gpuq.streams.events import Delta, End, Event, Start

DONE = b"data: [DONE]\n\n"


def not_found(model: str) -> str:
    return f"model {model!r} is not registered (see GET /v1/models)"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def error_event(message: str, *, code: str) -> bytes:
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}})


def ended_badly(job_id: str, end: End) -> str | None:
    """What to tell a caller whose job did not succeed; None when it did."""
    if end.status == JobStatus.SUCCEEDED:
        return None
    if end.status == JobStatus.CANCELLED:
        return f"job {job_id} was cancelled"
    return f"job {job_id} failed: {end.error or 'no reason recorded'}"


def answer(endpoint: str, job: Job, *, encoding_format: str = "float", dimensions: int | None = None) -> dict:
    """The response object of a finished job (as the Batch API's output lines have it)."""
    if endpoint != EMBEDDINGS:
        return response_body(endpoint, job)
    vectors = shortened((job.result or {}).get("embeddings", []), dimensions)
    body = response_body(endpoint, job, vectors=vectors)
    if encoding_format == "base64":
        for item in body["data"]:
            item["embedding"] = as_base64(item["embedding"])
    return body


class _Chunks:
    """One call's chunks: the same id, time and model on each, as OpenAI sends them."""

    def __init__(self, endpoint: str, job: Job, *, include_usage: bool) -> None:
        self.chat = endpoint == CHAT
        self.include_usage = include_usage
        self.head = {
            "id": f"chatcmpl-{job.id}" if self.chat else f"cmpl-{job.id}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(job.created_at.timestamp()),
            "model": job.model,
            "system_fingerprint": None,
        }

    def choice(
        self,
        *,
        text: str | None = None,
        role: bool = False,
        finish: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return sse(self.head | {"choices": [choice]} | ({"usage": None} if self.include_usage else {}))

    def ending(self, job: Job, end: End, held: list[str] | None, *, started: bool) -> list[bytes]:
        """The last chunks of a job that succeeded: the role if not sent yet, the held text
        (as tool calls, if it is some), the finish reason, the usage if asked for, ``[DONE]``."""
        out = [self.choice(role=True)] if self.chat and not started else []
        finish = end.finish_reason or "stop"
        if held is not None:
            message, finish = chat_choice(job, "".join(held), finish)
            if message["content"] or message.get("tool_calls"):
                out.append(self.choice(text=message["content"], tool_calls=message.get("tool_calls")))
        out.append(self.choice(finish=finish))
        if self.include_usage:
            out.append(self.usage(end))
        return [*out, DONE]

    def usage(self, end: End) -> bytes:
        usage = token_usage(end.prompt_tokens, end.completion_tokens, end.cached_tokens)
        return sse(self.head | {"choices": [], "usage": usage})


async def stream(events: AsyncIterator[Event], endpoint: str, job: Job, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The call's server-sent events, from its job's events."""
    chunks = _Chunks(endpoint, job, include_usage=include_usage)
    started = sent_text = False
    hold = bool(chunks.chat and (job.request or {}).get("tools"))  # the reply may be a call: held to the end
    held: list[str] = []
    async for event in events:
        if isinstance(event, Start):
            held.clear()  # a new run: nothing held was sent, and its text replaces it
        if isinstance(event, Start) and sent_text:
            # A worker died mid-answer and the job runs again from its start: what was sent
            # cannot be taken back, so this answer ends here (the job's row keeps the new run).
            yield error_event(
                f"the worker running job {job.id} stopped; the job is running again (attempt {event.attempt}) "
                f"and its text so far cannot be taken back: read GET /v1/jobs/{job.id}",
                code="job_restarted",
            )
            return
        if isinstance(event, Start | Delta) and chunks.chat and not started:
            started = True
            yield chunks.choice(role=True)
        if isinstance(event, Delta) and event.text:
            if hold:
                held.append(event.text)
                continue
            sent_text = True
            yield chunks.choice(text=event.text)
        if isinstance(event, End):
            problem = ended_badly(job.id, event)
            if problem is not None:
                yield error_event(problem, code=f"job_{event.status}")
                return
            for chunk in chunks.ending(job, event, held if hold else None, started=started):
                yield chunk
            return
