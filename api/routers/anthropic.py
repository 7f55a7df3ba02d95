"""/v1/messages and /v1/messages/batches: Anthropic's Messages API, each call a gpuq job.

The anthropic client works with ``base_url`` set to gpuq's root and a gpuq key as its
``api_key`` (sent as ``x-api-key``; a bearer token works too). ``anthropic-version`` is
accepted and changes nothing. Every refusal is in Anthropic's error shape (api/errors.py).
A message's id is its job's (``msg_<job id>``), also in ``X-Gpuq-Job-Id``; a Message Batch
is a gpuq batch (gpuq/batches/message_batches.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from api import calls
from api.calls import DropinCallDep
from api.deps import CallerDep, SessionDep, StateDep, visible_batch
from api.schemas.anthropic import (
    AnthropicErrorBody,
    AnthropicMessage,
    CountTokensCreate,
    InputTokens,
    MessageBatch,
    MessageBatchDeleted,
    MessageBatches,
    MessageBatchOptions,
    MessageCreate,
)
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.batches import message_batch_body, message_batches
from gpuq.batches import service as batches
from gpuq.batches.anthropic_format import MESSAGES
from gpuq.batches.anthropic_messages import message
from gpuq.batches.files import delete_stored_file, files_dir, save_upload
from gpuq.batches.queue_order import Planning
from gpuq.db.tables import Batch, JobKind, JobStatus
from gpuq.dropin import anthropic
from gpuq.dropin.call import (
    JOB_ID_HEADER,
    call_priority,
    call_spec,
    find_model,
    refuse_more_messages_than_the_context,
    with_max_tokens,
)
from gpuq.errors import RequestError
from gpuq.jobs.limits import admit_sync, precheck, tokenising_turn
from gpuq.jobs.request import refusal
from gpuq.jobs.submit import model_tokenizer
from gpuq.streams.events import ended_badly


def _version(
    anthropic_version: Annotated[
        str | None, Header(alias="anthropic-version", description="accepted; every version is answered the same")
    ] = None,
) -> None:
    """Declares the header the SDK sends on every call (so the OpenAPI document has it); there
    is one version of these routes, so any value is answered the same."""


router = APIRouter(prefix="/v1", tags=["anthropic"], dependencies=[Depends(_version)])


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    described = {
        404: "the model, or the message batch, does not exist",
        409: "the batch's state does not allow it, or the job was cancelled before it answered",
        429: "the key is over one of its limits, or the fleet cannot answer by X-Gpuq-Deadline (Retry-After)",
        500: "the job failed (its error is the message)",
        503: "the job queue (Redis) is unavailable",
        507: "the server's disk is full; nothing was stored",
    }
    return {s: {"model": AnthropicErrorBody, "description": described[s]} for s in statuses}


_STREAMED = "with stream: true, Anthropic's server-sent events (message_start ... message_stop)"


def not_found(model: str) -> str:
    return f"model: {model!r} is not registered (see GET /v1/models)"


@router.post(
    "/messages",
    response_model=AnthropicMessage,
    responses={
        200: {
            "description": "the message (header X-Gpuq-Job-Id: its job)",
            "content": {"text/event-stream": {"schema": {"type": "string", "description": _STREAMED}}},
        },
        **_errors(404, 409, 429, 500, 503),
    },
)
async def create_message(body: MessageCreate, call: DropinCallDep) -> Response:
    """Anthropic's Messages API, rendered with the model's own chat template; the
    ``X-Gpuq-Priority`` and ``X-Gpuq-Deadline`` headers as on the OpenAI routes."""
    request, db, state, caller, priority, deadline = call
    model = await find_model(db, body.model, not_found=not_found(body.model))
    refuse_more_messages_than_the_context(model, len(body.messages))
    job_request = await to_thread.run_sync(body.to_request)  # a long conversation takes a while to convert
    spec = call_spec(
        JobKind.GENERATE,
        body.model,
        await with_max_tokens(db, state.redis, caller, model, job_request),
        priority=call_priority(priority, caller),
        stream=body.stream,
        deadline=deadline,
    )
    job = await calls.submit(db, state, caller, spec)
    if body.stream:
        return calls.stream(state, job, anthropic.stream(calls.events(state, job.id), job), "text/event-stream")
    ended = await calls.until_end(request, state, job)
    if ended is None:
        return Response(status_code=calls.CLIENT_GONE)
    end, final = ended
    problem = ended_badly(job.id, end)
    if problem is not None:
        raise RequestError(409 if end.status == JobStatus.CANCELLED else 500, problem)
    return JSONResponse(message(final), headers={JOB_ID_HEADER: job.id})


@router.post("/messages/count_tokens", response_model=InputTokens, responses=_errors(404))
async def count_tokens(body: CountTokensCreate, db: SessionDep, caller: CallerDep) -> InputTokens:
    """The tokens the message's prompt takes (its system, messages and tools, rendered with
    the model's chat template), as the worker would count them; nothing is run."""
    model = await find_model(db, body.model, not_found=not_found(body.model))
    if not model.can_generate:
        raise RequestError(400, f"model: {model.name!r} is an embedding model; it answers no messages")
    request = await to_thread.run_sync(body.to_request)

    def count() -> int:
        try:
            return model_tokenizer(model).count_request_tokens(request)
        except ValueError as exc:  # no chat template
            raise RequestError(400, f"model: {exc}") from None

    async with tokenising_turn(caller.owner):
        return InputTokens(input_tokens=await to_thread.run_sync(count))


# ---------------------------------------------------------------- Message Batches


async def _message_batch(db: SessionDep, caller: Caller, batch_id: str) -> Batch:
    """The caller's Message Batch; another kind of batch, or another tenant's, is a 404 as a missing one."""
    try:
        batch = await visible_batch(db, caller, batch_id)
    except RequestError:
        batch = None
    if batch is None or not message_batches.is_message_batch(batch):
        raise RequestError(404, f"message batch {batch_id!r} does not exist")
    return batch


async def _object(request: Request, db: SessionDep, batch: Batch) -> MessageBatch:
    base = str(request.base_url)
    return MessageBatch.model_validate(
        await db.run_sync(lambda s: message_batches.batch_object(s, batch, base_url=base))
    )


# The body is read by the route as it streams (gpuq/batches/message_batch_body.py), not by
# FastAPI: the document still says what it is.
_BATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/MessageBatchCreate"}}},
    }
}


@router.post(
    "/messages/batches", response_model=MessageBatch, responses=_errors(404, 429, 503, 507), openapi_extra=_BATCH_BODY
)
async def create_message_batch(request: Request, db: SessionDep, state: StateDep, caller: CallerDep) -> MessageBatch:
    """Run up to 100,000 Messages requests as one gpuq batch. Every request is checked first;
    a bad one refuses the batch (400, naming its index and custom_id) and nothing is created.
    The body is streamed to disk and its requests read one at a time, never held whole."""
    directory = files_dir(state.settings.data_dir)
    body = await message_batch_body.spool(request.stream(), directory)
    try:
        outline = await to_thread.run_sync(message_batch_body.outline, body)
        options = _options(outline.fields)
        await state.check_webhook_url(options.webhook_url)
        count = outline.requests
        # A key over its limits is refused before its requests are checked (spending nothing).
        await precheck(db, state.redis, caller, queued_jobs=count, submissions=1)

        def start() -> str:
            file = message_batches.store_requests(message_batch_body.requests(body), directory)
            file.owner = caller.owner
            with state.sync_sessions() as session:
                save_upload(session, file)
                try:
                    return batches.start_batch(
                        session,
                        state.redis,
                        input_file_id=file.id,
                        endpoint=MESSAGES,
                        completion_window="24h",  # Anthropic's: a batch expires a day after its creation
                        metadata=None,
                        priority=options.priority,
                        timeout_s=state.settings.job_timeout_s,
                        webhook_url=str(options.webhook_url) if options.webhook_url else None,
                        owner=caller.owner,
                        api_key_id=caller.key_id,
                        admit=lambda s: admit_sync(s, state.redis, caller, queued_jobs=count, submissions=1),
                        worker_slots=state.settings.worker_slots,
                        planning=Planning.of(state.settings),
                    ).id
                except BaseException as exc:
                    session.rollback()
                    delete_stored_file(session, file)  # a refused batch leaves nothing behind
                    if isinstance(exc, RequestError):  # its lines are the requests, counted from 0
                        raise RequestError(exc.status, _requests_named(exc.message), param=exc.param) from None
                    raise

        batch_id = await to_thread.run_sync(start)
    finally:
        body.unlink(missing_ok=True)
    return await _object(request, db, await _message_batch(db, caller, batch_id))


def _options(fields: dict[str, Any]) -> MessageBatchOptions:
    try:
        return MessageBatchOptions.model_validate(fields)
    except ValidationError as exc:
        raise refusal(exc) from None


def _requests_named(message: str) -> str:
    """The batch engine's "line N" as the request it is, ``requests[N - 1]``."""
    named = re.sub(r"\bline (\d+)", lambda found: f"requests[{int(found.group(1)) - 1}]", message)
    return named.replace(" invalid lines: ", " invalid requests: ")


@router.get("/messages/batches/{batch_id}", response_model=MessageBatch, responses=_errors(404))
async def read_message_batch(batch_id: str, request: Request, db: SessionDep, caller: CallerDep) -> MessageBatch:
    return await _object(request, db, await _message_batch(db, caller, batch_id))


@router.get("/messages/batches", response_model=MessageBatches)
async def list_message_batches(
    request: Request,
    db: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    after_id: Annotated[str | None, Query(description="the page of older batches after this one")] = None,
    before_id: Annotated[str | None, Query(description="the page of newer batches before this one")] = None,
) -> MessageBatches:
    """Newest first; submitters see their own tenant's batches."""
    if after_id is not None and before_id is not None:
        raise RequestError(400, "give after_id or before_id, not both")

    def page(session: Session) -> tuple[list[Batch], bool]:
        return store.list_batches(
            session, limit=limit, after=after_id, before=before_id, owner=caller.tenant_filter, endpoint=MESSAGES
        )

    try:
        rows, has_more = await db.run_sync(page)
    except LookupError as exc:
        raise RequestError(400, f"message batch {exc.args[0]!r} does not exist") from None
    data = [await _object(request, db, b) for b in rows]
    return MessageBatches(
        data=data, has_more=has_more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


@router.post("/messages/batches/{batch_id}/cancel", response_model=MessageBatch, responses=_errors(404, 409))
async def cancel_message_batch(
    batch_id: str, request: Request, db: SessionDep, state: StateDep, caller: CallerDep
) -> MessageBatch:
    """Queued requests are canceled at once, running ones at their next token; the batch is
    ``canceling`` until they have stopped."""
    await _message_batch(db, caller, batch_id)
    await db.run_sync(lambda s: batches.cancel_batch(s, state.redis, batch_id))
    return await _object(request, db, await _message_batch(db, caller, batch_id))


@router.delete("/messages/batches/{batch_id}", response_model=MessageBatchDeleted, responses=_errors(404, 409))
async def delete_message_batch(batch_id: str, db: SessionDep, caller: CallerDep) -> MessageBatchDeleted:
    """An ended batch, its jobs and its results (409 while it runs: cancel it first)."""
    batch = await _message_batch(db, caller, batch_id)
    await db.run_sync(lambda s: message_batches.delete_message_batch(s, batch))
    return MessageBatchDeleted(id=batch_id)


@router.get(
    "/messages/batches/{batch_id}/results",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-jsonl": {}}, "description": "one result line per answered request"},
        **_errors(404),
    },
)
async def message_batch_results(batch_id: str, db: SessionDep, caller: CallerDep) -> StreamingResponse:
    """Each answered request's result by custom_id (succeeded, errored, canceled or expired),
    as JSONL; while the batch runs, those answered so far."""
    batch = await _message_batch(db, caller, batch_id)
    lines = await db.run_sync(lambda s: list(batches.results_so_far(s, batch)))
    return StreamingResponse(iter(lines), media_type="application/x-jsonl")
