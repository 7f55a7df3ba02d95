"""Anthropic's Messages stream: server-sent events from a call's job events.

The events are Anthropic's, each an ``event:`` line naming its type and a ``data:`` line:
``message_start`` (the message with no content yet, and the prompt's tokens) and a ``ping``
at once, so a client sees its call accepted while the job waits in its queue; then a text
block (``content_block_start``, a ``text_delta`` per piece of text, ``content_block_stop``);
``message_delta`` with the stop reason, the stop sequence and the usage; ``message_stop``.
A job that fails or is cancelled ends the stream with an ``error`` event, which the
``anthropic`` SDK raises.

When the request offers tools the text is held until the end, as on the OpenAI routes
(gpuq/dropin/openai.py): only the whole reply says whether it is a call. It then goes out
as blocks: the text outside the calls, if any, and each call as a ``tool_use`` block whose
input comes whole in one ``input_json_delta``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from gpuq.batches.anthropic_messages import content, error, message_id, usage
from gpuq.db.tables import Job
from gpuq.streams.events import Delta, End, Event, Start, ended_badly, restarted_mid_answer


def sse(kind: str, data: dict[str, Any]) -> bytes:
    body = json.dumps({"type": kind, **data}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {body}\n\n".encode()


def error_event(kind: str, message: str) -> bytes:
    return sse("error", {"error": error(kind, message)["error"]})


class _Blocks:
    """The content blocks sent so far, each with its index."""

    def __init__(self) -> None:
        self.count = 0
        self.open_text = False

    def text(self, text: str) -> list[bytes]:
        out = []
        if not self.open_text:
            out.append(sse("content_block_start", {"index": self.count, "content_block": {"type": "text", "text": ""}}))
            self.open_text = True
        out.append(sse("content_block_delta", {"index": self.count, "delta": {"type": "text_delta", "text": text}}))
        return out

    def close(self) -> list[bytes]:
        if not self.open_text:
            return []
        self.open_text = False
        self.count += 1
        return [sse("content_block_stop", {"index": self.count - 1})]

    def tool_use(self, block: dict[str, Any]) -> list[bytes]:
        index, self.count = self.count, self.count + 1
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        partial = json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False)
        return [
            sse("content_block_start", {"index": index, "content_block": start}),
            sse(
                "content_block_delta", {"index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}
            ),
            sse("content_block_stop", {"index": index}),
        ]


def _start(job: Job) -> list[bytes]:
    empty: dict[str, Any] = {
        "id": message_id(job.id),
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(job.prompt_tokens, 0, 0),
    }
    return [sse("message_start", {"message": empty}), sse("ping", {})]


def _ending(job: Job, end: End, blocks: _Blocks, held: list[str] | None) -> list[bytes]:
    problem = ended_badly(job.id, end)
    if problem is not None:
        return [error_event("api_error", problem)]
    out: list[bytes] = []
    if held is not None:
        made, reason, stop = content(job, "".join(held), end.finish_reason, end.stop_sequence)
        for block in made:
            out += blocks.text(block["text"]) + blocks.close() if block["type"] == "text" else blocks.tool_use(block)
    else:
        _made, reason, stop = content(job, "", end.finish_reason, end.stop_sequence)
        out += blocks.close()
    figures = usage(end.prompt_tokens, end.completion_tokens, end.cached_tokens)
    out.append(sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": stop}, "usage": figures}))
    return [*out, sse("message_stop", {})]


async def stream(events: AsyncIterator[Event], job: Job) -> AsyncIterator[bytes]:
    """The call's server-sent events, from its job's events."""
    for line in _start(job):
        yield line
    blocks = _Blocks()
    sent_text = False
    held: list[str] | None = [] if (job.request or {}).get("tools") else None
    async for event in events:
        if isinstance(event, Start) and held:
            held = []  # nothing of it was sent: the new run's text replaces it
        restarted = restarted_mid_answer(job.id, event, sent_text=sent_text)
        if restarted is not None:
            yield error_event("api_error", restarted)
            return
        if isinstance(event, Delta) and event.text and event.index == 0:
            if held is not None:
                held.append(event.text)
                continue
            sent_text = True
            for line in blocks.text(event.text):
                yield line
        if isinstance(event, End):
            for line in _ending(job, event, blocks, held):
                yield line
            return
