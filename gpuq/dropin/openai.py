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

from gpuq.batches.openai_choices import chat_logprobs, echoed_prompt, legacy_logprobs
from gpuq.batches.openai_format import CHAT, EMBEDDINGS, chat_choice, response_body, token_usage
from gpuq.db.tables import Job
from gpuq.dropin.vectors import as_base64, shortened
from gpuq.streams.events import Delta, End, Event, Start, ended_badly, restarted_mid_answer

DONE = b"data: [DONE]\n\n"


def not_found(model: str) -> str:
    return f"model {model!r} is not registered (see GET /v1/models)"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def error_event(message: str, *, code: str) -> bytes:
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}})


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

    def __init__(self, endpoint: str, job: Job, *, include_usage: bool, service_tier: str | None = None) -> None:
        self.chat = endpoint == CHAT
        self.include_usage = include_usage
        request = job.request or {}
        self.samples = int(request.get("n", 1))
        self.logprobs = request.get("logprobs") is not None
        # Legacy logprobs give each token's character offset in the text, which starts after the prompt.
        self._offsets = [len(echoed_prompt(request, {}))] * self.samples
        self.head = {
            "id": f"chatcmpl-{job.id}" if self.chat else f"cmpl-{job.id}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(job.created_at.timestamp()),
            "model": job.model,
            "system_fingerprint": None,
        } | ({"service_tier": service_tier} if service_tier else {})

    def choice(
        self,
        index: int = 0,
        *,
        text: str | None = None,
        role: bool = False,
        finish: str | None = None,
        logprobs: list[dict[str, Any]] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> bytes:
        shown = logprobs if self.logprobs else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
            lp = chat_logprobs(shown) if shown else None
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            lp = None
            if shown:
                lp = legacy_logprobs(shown, offset=self._offsets[index])
                self._offsets[index] += sum(len(e["token"]) for e in shown)
            choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return sse(self.head | {"choices": [choice]} | ({"usage": None} if self.include_usage else {}))

    def roles(self) -> list[bytes]:
        return [self.choice(i, role=True) for i in range(self.samples)]

    def ending(self, job: Job, end: End, held: dict[int, list[str]] | None, *, started: bool) -> list[bytes]:
        """The last chunks: the roles if not sent yet, the held text of each choice (as tool
        calls, if it is some), each choice's finish reason, the usage if asked for, ``[DONE]``;
        or the error object of a job that did not succeed."""
        problem = ended_badly(job.id, end)
        if problem is not None:
            return [error_event(problem, code=f"job_{end.status}")]
        out = self.roles() if self.chat and not started else []
        for index, reason in enumerate(end.finish_reasons or [end.finish_reason or "stop"]):
            finish = reason
            if held is not None:
                message, finish = chat_choice(job, "".join(held.get(index, [])), reason)
                if message["content"] or message.get("tool_calls"):
                    out.append(self.choice(index, text=message["content"], tool_calls=message.get("tool_calls")))
            out.append(self.choice(index, finish=finish))
        if self.include_usage:
            out.append(self.usage(end))
        return [*out, DONE]

    def usage(self, end: End) -> bytes:
        usage = token_usage(end.prompt_tokens, end.completion_tokens, end.cached_tokens)
        return sse(self.head | {"choices": [], "usage": usage})


async def stream(
    events: AsyncIterator[Event], endpoint: str, job: Job, *, include_usage: bool, service_tier: str | None = None
) -> AsyncIterator[bytes]:
    """The call's server-sent events, from its job's events (each chunk naming
    ``service_tier`` when the request named one)."""
    chunks = _Chunks(endpoint, job, include_usage=include_usage, service_tier=service_tier)
    started = sent_text = False
    hold = bool(chunks.chat and (job.request or {}).get("tools"))  # a call, maybe: each choice's text held
    held: dict[int, list[str]] = {}
    async for event in events:
        if isinstance(event, Start):
            held.clear()  # a new run: nothing held was sent, and its text replaces it
        restarted = restarted_mid_answer(job.id, event, sent_text=sent_text)
        if restarted is not None:
            yield error_event(restarted, code="job_restarted")
            return
        if isinstance(event, Start | Delta) and chunks.chat and not started:
            started = True
            for role in chunks.roles():
                yield role
        if isinstance(event, Delta) and (event.text or event.logprobs):
            if hold:
                held.setdefault(event.index, []).append(event.text)
                continue
            sent_text = True
            yield chunks.choice(event.index, text=event.text, logprobs=event.logprobs)
        if isinstance(event, End):
            for chunk in chunks.ending(job, event, held if hold else None, started=started):
                yield chunk
            return
