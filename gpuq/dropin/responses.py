"""OpenAI's Responses API over gpuq jobs: the stored responses a caller may read, continue
and delete, and the events of a response's stream.

**Reading.** A response is its job (gpuq/batches/responses_format.py). Only a job made by
``POST /v1/responses``, stored (``store`` not false), not deleted, and of the caller's
tenant is a response to that caller; anything else answers 404, as a missing one does.

**Streams** are OpenAI's server-sent events, each ``event: <type>`` and its JSON with a
``sequence_number``: ``response.created``, ``response.in_progress`` when the job starts,
the answer as a message item (``output_item.added``, ``content_part.added``,
``output_text.delta``..., ``output_text.done``, ``content_part.done``,
``output_item.done``), then ``response.completed`` (``response.incomplete`` when it ran out
of ``max_output_tokens``; ``response.failed`` when the job failed or was cancelled, its
status saying which). When the request offers tools the text is held to the end, as chat
completions hold it (only the whole reply says whether it is a call), and calls go out as
``function_call`` items with their arguments in one ``function_call_arguments.delta``.

The events are a function of the job's token stream (gpuq/streams/), so reading it again
gives the same events with the same numbers: ``GET /v1/responses/{id}?stream=true&
starting_after=N`` follows the job's stream from its start and sends what comes after N.
Once that stream has expired (a minute after the job's end), the events are rebuilt from
the job's row, the whole text as one delta.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.auth.access import Caller
from gpuq.batches.openai_choices import token_logprob
from gpuq.batches.response_items import output_text
from gpuq.batches.responses_format import (
    Outcome,
    conversation,
    fields_of,
    job_id_of,
    message_id,
    outcome_of,
    response_object,
)
from gpuq.db.tables import Job, JobKind, JobStatus, utcnow
from gpuq.errors import RequestError
from gpuq.redis_keys import job_stream_key
from gpuq.store.responses import forget_response
from gpuq.streams.events import Delta, End, Event, Start, restarted_mid_answer
from gpuq.streams.follow import end_of

# Kept when a response is deleted: what it cost and how it was sampled, not what it said.
_FORGOTTEN = ("messages", "tools", "tool_choice", "json_schema", "prompt", "prompt_token_ids")


def not_found(response_id: str) -> RequestError:
    return RequestError(404, f"response {response_id!r} not found", code="response_not_found")


async def _job(db: AsyncSession, job_id: str) -> Job | None:
    return await db.run_sync(store.get_job, job_id)


def _is_response(job: Job | None, caller: Caller) -> bool:
    if job is None or job.kind != JobKind.GENERATE or not caller.may_see(job.owner):
        return False
    if not isinstance((job.request or {}).get("response"), dict):
        return False
    fields = fields_of(job)
    return fields.store and not fields.deleted


async def stored_response(db: AsyncSession, caller: Caller, response_id: str) -> Job:
    """The caller's stored response; a 404 for anything else."""
    job = await _job(db, job_id_of(response_id))
    if job is None or not _is_response(job, caller):
        raise not_found(response_id)
    return job


async def history(db: AsyncSession, caller: Caller, previous_response_id: str | None) -> list[dict[str, Any]]:
    """The conversation a response continues: the previous one's turns (none without one)."""
    if previous_response_id is None:
        return []
    job = await _job(db, job_id_of(previous_response_id))
    if job is None or not _is_response(job, caller):
        raise RequestError(
            404,
            f"previous response with id {previous_response_id!r} not found",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if job.status != JobStatus.SUCCEEDED:
        raise RequestError(
            400,
            f"previous response {previous_response_id!r} is {response_object(job)['status']}: "
            "only a completed (or incomplete) response can be continued",
            param="previous_response_id",
        )
    return conversation(job)


async def forget(db: AsyncSession, job: Job, response_id: str) -> None:
    """DELETE: the response's texts leave its job's row, which stays, with its figures, in
    gpuq's history and stats; a response still running is refused (cancel it first)."""
    request = {k: v for k, v in (job.request or {}).items() if k not in _FORGOTTEN}
    request["response"] = fields_of(job).model_copy(update={"deleted": True, "metadata": None}).model_dump()
    result = {"finish_reason": job.result["finish_reason"]} if job.result and "finish_reason" in job.result else None
    if not await db.run_sync(lambda s: forget_response(s, job.id, request=request, result=result)):
        raise RequestError(
            409,
            f"response {response_id!r} is still {response_object(job)['status']}: cancel it first "
            f"(POST /v1/responses/{response_id}/cancel), then delete it",
            code="response_not_finished",
        )


# ---------------------------------------------------------------- streams


def sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class _Numbered:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.next, **fields}
        self.next += 1
        return event


def _message_opened(event: _Numbered, item_id: str) -> list[dict[str, Any]]:
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    return [
        event("response.output_item.added", output_index=0, item=item),
        event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=output_text("")),
    ]


def _message_done(event: _Numbered, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"]),
        event("response.content_part.done", **where, part=part),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _call_events(event: _Numbered, item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    return [
        event("response.output_item.added", output_index=index, item=item | {"status": "in_progress", "arguments": ""}),
        event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
        event("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]),
        event("response.output_item.done", output_index=index, item=item),
    ]


Reread = Callable[[], Awaitable[Job | None]]


class _Answer:
    """One response's events, built from its job's events as they come."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.event = _Numbered()
        self.item_id = message_id(job.id)
        self.hold = bool((job.request or {}).get("tools"))  # a call, maybe: the text waits for the end
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.opened = self.sent = self.started = False

    def snapshot(self, status: JobStatus) -> dict[str, Any]:
        return response_object(self.job, Outcome(status=status.value))

    def start(self, event: Start) -> list[dict[str, Any]]:
        restarted = restarted_mid_answer(self.job.id, event, sent_text=self.sent)
        if restarted is not None:
            return [self.event("error", code="job_restarted", message=restarted, param=None)]
        self.text.clear()
        self.logprobs.clear()
        if self.started:
            return []
        self.started = True
        return [self.event("response.in_progress", response=self.snapshot(JobStatus.RUNNING))]

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        self.text.append(text)
        shown = [token_logprob(e) for e in logprobs or ()]
        self.logprobs += shown
        if self.hold:
            return []
        out = [] if self.opened else _message_opened(self.event, self.item_id)
        self.opened = self.sent = True
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return [*out, self.event("response.output_text.delta", **where, delta=text, logprobs=shown)]

    def end(self, end: End, row: Job | None) -> list[dict[str, Any]]:
        out = [] if self.started else self.start(Start(attempt=1))
        said = "".join(self.text)
        outcome = outcome_of(row) if row is not None and JobStatus(row.status).is_final else None
        if outcome is not None and outcome.text.startswith(said) and len(outcome.text) > len(said):
            out += self.delta(outcome.text[len(said) :], None)  # what the token stream no longer had
        if outcome is None:
            outcome = Outcome(
                status=end.status,
                text="".join(self.text),
                finish_reason=end.finish_reason,
                logprobs=self.logprobs if (self.job.request or {}).get("logprobs") is not None else None,
                error=end.error,
                prompt_tokens=end.prompt_tokens,
                completion_tokens=end.completion_tokens,
                cached_tokens=end.cached_tokens,
                finished_at=utcnow(),
            )
        final = response_object(self.job, outcome)
        if end.status != JobStatus.SUCCEEDED:
            return [*out, self.event("response.failed", response=final)]
        for index, item in enumerate(final["output"]):
            if item["type"] == "function_call":
                out += _call_events(self.event, item, index)
                continue
            if not self.opened:
                out += _message_opened(self.event, self.item_id)
                self.opened = True
                if item["content"][0]["text"]:
                    where = {"item_id": self.item_id, "output_index": index, "content_index": 0}
                    text = item["content"][0]["text"]
                    out.append(self.event("response.output_text.delta", **where, delta=text, logprobs=[]))
            out += _message_done(self.event, item, index)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*out, self.event(kind, response=final)]


async def events(job_events: AsyncIterator[Event], job: Job, *, reread: Reread | None = None) -> AsyncIterator[dict]:
    """The response's events from its job's; ``reread``: the job's final row, read at the end
    (a replay: the row's text is the truth where the token stream lacks some)."""
    answer = _Answer(job)
    yield answer.event("response.created", response=answer.snapshot(JobStatus.QUEUED))
    async for event in job_events:
        if isinstance(event, Start):
            out = answer.start(event)
            for e in out:
                yield e
            if out and out[0]["type"] == "error":
                return
        elif isinstance(event, Delta) and event.index == 0 and (event.text or event.logprobs):
            for e in answer.delta(event.text, event.logprobs):
                yield e
        elif isinstance(event, End):
            row = await reread() if reread is not None else None
            for e in answer.end(event, row):
                yield e
            return


async def stream(
    job_events: AsyncIterator[Event], job: Job, *, starting_after: int | None = None, reread: Reread | None = None
) -> AsyncIterator[bytes]:
    """The response's server-sent events, those numbered after ``starting_after``."""
    async for event in events(job_events, job, reread=reread):
        if starting_after is None or event["sequence_number"] > starting_after:
            yield sse(event)


async def recorded(job: Job) -> AsyncIterator[Event]:
    """A finished job's events rebuilt from its row: its start, its whole text, its end."""
    outcome = outcome_of(job)
    yield Start(attempt=max(job.attempts, 1))
    if outcome.text:
        yield Delta(outcome.text, outcome.completion_tokens or 0)
    yield end_of(job)


async def token_stream_expired(streams: AsyncRedis, job: Job) -> bool:
    """A finished job whose token stream is gone (or unreadable): its row tells the rest."""
    if not JobStatus(job.status).is_final:
        return False
    try:
        return not await streams.exists(job_stream_key(job.id))
    except RedisError:
        return True
