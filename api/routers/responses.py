"""/v1/responses: OpenAI's Responses API, each response a gpuq job.

A response's id is its job's (``resp_<x>`` is job ``job_<x>``, named in ``X-Gpuq-Job-Id``
too), so the dashboard, history, stats and webhooks see it as the job it is. Background
responses answer at once (``queued``) and are read, cancelled, or streamed again from where
a reader left off; stored ones are continued with ``previous_response_id``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from anyio import to_thread
from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse

from api import calls
from api.calls import DropinCallDep
from api.deps import CallerDep, SessionDep, StateDep
from api.errors import errors
from api.schemas import ErrorBody
from api.schemas.responses import ResponseDeleted, ResponseItemList, ResponseObject
from gpuq.batches.response_items import items_of
from gpuq.batches.responses_format import JOB_PREFIX, ResponseCreate, fields_of, response_object
from gpuq.db.tables import Job, JobKind, JobStatus
from gpuq.dropin import openai, responses
from gpuq.dropin.call import (
    JOB_ID_HEADER,
    call_priority,
    call_spec,
    echoed_tier,
    find_model,
    refuse_more_messages_than_the_context,
    with_max_tokens,
)
from gpuq.errors import RequestError
from gpuq.jobs.cancel import cancel_job
from gpuq.queue_names import Priority
from gpuq.streams.events import End, ended_badly

router = APIRouter(prefix="/v1/responses", tags=["openai"])

CANCEL_WAIT_S = 10.0  # a running response stops at its next token: the cancel answers once it has
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens"}  # the job's names, as the body says them
_STREAMED = {"schema": {"type": "string", "description": "OpenAI's Responses events (`event:` and `data:` lines)"}}


def _answers(description: str, *, streamed: bool) -> dict[int | str, dict[str, Any]]:
    answer: dict[str, Any] = {"model": ResponseObject, "description": description}
    if streamed:
        answer["content"] = {"text/event-stream": _STREAMED}
    return {200: answer}


@router.post(
    "",
    response_model=None,
    responses={
        **_answers("the response (header X-Gpuq-Job-Id: its job); with stream: true, its events", streamed=True),
        **errors(404, 409, 503),
        429: {
            "model": ErrorBody,
            "description": "the key is over one of its limits, or the fleet cannot answer by X-Gpuq-Deadline "
            "(deadline_unreachable); Retry-After says when trying again can succeed",
        },
        500: {"model": ErrorBody, "description": "the job failed (its error is the message)"},
    },
)
async def create_response(body: ResponseCreate, call: DropinCallDep) -> Response:
    """A response: the model's answer to `input` (after `instructions` and, with
    `previous_response_id`, that stored response's conversation), as a message or function calls."""
    request, db, state, caller, priority, deadline = call
    body.refuse_unknown()
    body.check()
    model = await find_model(db, body.model, not_found=openai.not_found(body.model))
    previous = await responses.history(db, caller, body.previous_response_id)
    given = 1 if isinstance(body.input, str) else len(body.input)
    refuse_more_messages_than_the_context(model, given + len(previous) + (1 if body.instructions else 0))
    # Off the event loop: a long conversation takes tens of milliseconds to convert.
    background, stream = bool(body.background), bool(body.stream)
    default = Priority.NORMAL if background else Priority.HIGH
    chosen = call_priority(priority, caller, service_tier=body.service_tier, default=default)
    tier = echoed_tier(body.service_tier)
    params = await to_thread.run_sync(lambda: body.params(previous, service_tier=tier))
    try:
        sized = await with_max_tokens(db, state.redis, caller, model, params)
        # A background response publishes its tokens, so that it can be streamed later.
        spec = call_spec(
            JobKind.GENERATE, body.model, sized, priority=chosen, stream=stream or background, deadline=deadline
        )
        job = await calls.submit(db, state, caller, spec)
    except RequestError as exc:
        if exc.param not in _PARAMS:
            raise
        raise RequestError(
            exc.status, exc.message, param=_PARAMS[exc.param], code=exc.code, headers=exc.headers
        ) from None
    if stream:
        content = responses.stream(calls.events(state, job.id), job)
        if background:  # nobody waits on it: a reader that goes away cancels nothing
            return calls.CallStream(content, on_gone=_nothing, media_type="text/event-stream", job_id=job.id)
        return calls.stream(state, job, content, "text/event-stream")
    if background:
        return JSONResponse(response_object(job), headers={JOB_ID_HEADER: job.id})
    ended = await calls.until_end(request, state, job)
    if ended is None:
        return Response(status_code=calls.CLIENT_GONE)
    end, final = ended
    problem = ended_badly(job.id, end)
    if problem is not None:
        raise RequestError(409 if end.status == JobStatus.CANCELLED else 500, problem, code=f"job_{end.status}")
    return JSONResponse(response_object(final), headers={JOB_ID_HEADER: job.id})


async def _nothing() -> None:
    """A background response's reader leaving cancels nothing: the job runs on, to be read later."""


@router.get(
    "/{response_id}",
    response_model=None,
    responses={
        **_answers("the response as it stands; with stream=true, its events", streamed=True),
        **errors(404),
    },
)
async def read_response(
    response_id: str,
    db: SessionDep,
    state: StateDep,
    caller: CallerDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1, description="with stream: the events after this one")] = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> Response:
    """A stored response: queued, in_progress, completed, incomplete, failed or cancelled.
    With `stream=true`, its events from the start (or after `starting_after`) until its end."""
    job = await responses.stored_response(db, caller, response_id)
    if not stream:
        return JSONResponse(response_object(job), headers={JOB_ID_HEADER: job.id})
    await db.close()  # the stream may last minutes and holds no database connection
    expired = await responses.token_stream_expired(state.streams, job)
    source = responses.recorded(job) if expired else calls.events(state, job.id)

    async def reread() -> Job | None:
        async with state.sessions() as session:
            return await session.run_sync(lambda s: s.get(Job, job.id))

    content = responses.stream(source, job, starting_after=starting_after, reread=reread)
    return calls.CallStream(content, on_gone=_nothing, media_type="text/event-stream", job_id=job.id)


@router.post(
    "/{response_id}/cancel",
    response_model=None,
    responses={
        **_answers("the response, cancelled (or as it ended meanwhile)", streamed=False),
        **errors(404, 409),
        400: {"model": ErrorBody, "description": "not a background response: only those can be cancelled"},
    },
)
async def cancel_response(response_id: str, db: SessionDep, state: StateDep, caller: CallerDep) -> Response:
    """A background response, queued or in progress, is cancelled: at once if queued, at its
    next token if running (the answer waits for that, up to 10 s). One that is already
    cancelled is answered as it is."""
    job = await responses.stored_response(db, caller, response_id)
    if not fields_of(job).background:
        raise RequestError(
            400, f"response {response_id!r} is not a background response: only those can be cancelled",
            code="not_background",
        )  # fmt: skip
    if job.status == JobStatus.CANCELLED:
        return JSONResponse(response_object(job), headers={JOB_ID_HEADER: job.id})
    if JobStatus(job.status).is_final:
        raise RequestError(
            409, f"response {response_id!r} is already {response_object(job)['status']}; nothing to cancel",
            code="response_finished",
        )  # fmt: skip
    try:
        job = await cancel_job(db, state.redis, job.id)
    except RequestError as exc:
        if exc.status != 409:
            raise
    if job.status == JobStatus.RUNNING:
        await db.close()
        with anyio.move_on_after(CANCEL_WAIT_S):
            await _until_end(calls.events(state, job.id))
        job = await responses.stored_response(db, caller, response_id)
    return JSONResponse(response_object(job), headers={JOB_ID_HEADER: job.id})


async def _until_end(events: AsyncIterator[object]) -> None:
    async for event in events:
        if isinstance(event, End):
            return


@router.delete("/{response_id}", response_model=ResponseDeleted, responses=errors(404, 409))
async def delete_response(response_id: str, db: SessionDep, caller: CallerDep) -> ResponseDeleted:
    """The response's texts (instructions, input, output, metadata) are deleted and it can no
    longer be read or continued. Its job stays in gpuq's history and stats, with its figures."""
    job = await responses.stored_response(db, caller, response_id)
    await responses.forget(db, job, response_id)
    return ResponseDeleted(id=response_id)


@router.get("/{response_id}/input_items", response_model=ResponseItemList, responses=errors(404))
async def list_input_items(
    response_id: str,
    db: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> ResponseItemList:
    """The items the response answered: the conversation it continued (with
    `previous_response_id`) and its input, newest first unless `order=asc`; page with `after`."""
    job = await responses.stored_response(db, caller, response_id)
    messages = list((job.request or {}).get("messages") or [])
    if fields_of(job).instructions:
        messages = messages[1:]
    items = items_of(messages, prefix=job.id.removeprefix(JOB_PREFIX))
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise RequestError(422, f"after: {after!r} is not an item of response {response_id!r}", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return ResponseItemList(
        data=page,
        first_id=page[0]["id"] if page else None,
        last_id=page[-1]["id"] if page else None,
        has_more=len(items) > limit,
    )
