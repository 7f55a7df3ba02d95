"""/v1/chat/completions, /v1/completions, /v1/embeddings: OpenAI's API, each call a gpuq job.

The openai client works with ``base_url`` set to gpuq's ``/v1`` and a gpuq key as its
``api_key``. Streamed answers are server-sent events in OpenAI's chunk format; the answer
names its job in ``X-Gpuq-Job-Id``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from api import calls
from api.calls import DropinCallDep
from api.deps import SessionDep, StateDep
from api.schemas import ErrorBody
from api.schemas.openai import ChatCompletionCreate, CompletionCreate, EmbeddingCreate
from gpuq.auth.access import Caller
from gpuq.batches.openai_format import CHAT, COMPLETIONS, EMBEDDINGS
from gpuq.db.tables import Job, JobKind, JobStatus
from gpuq.dropin import openai
from gpuq.dropin.call import (
    JOB_ID_HEADER,
    call_priority,
    call_spec,
    echoed_tier,
    find_model,
    refuse_more_messages_than_the_context,
    with_max_tokens,
)
from gpuq.dropin.vectors import check_dimensions
from gpuq.errors import RequestError

router = APIRouter(prefix="/v1", tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "a parameter gpuq cannot honour, or a prompt that does not fit"},
    401: {"model": ErrorBody, "description": "no valid API key"},
    404: {"model": ErrorBody, "description": "the model is not registered"},
    409: {"model": ErrorBody, "description": "the job was cancelled (by someone else) before it answered"},
    422: {"model": ErrorBody, "description": "the body does not have the request's shape"},
    429: {
        "model": ErrorBody,
        "description": "the key is over one of its limits, or the fleet cannot answer by X-Gpuq-Deadline "
        "(deadline_unreachable); Retry-After says when trying again can succeed",
    },
    500: {"model": ErrorBody, "description": "the job failed (its error is the message)"},
    503: {"model": ErrorBody, "description": "the job queue (Redis) is unavailable"},
}


def _answers(stream_description: str | None) -> dict[int | str, dict[str, Any]]:
    content: dict[str, Any] = {"application/json": {}}
    if stream_description:
        content["text/event-stream"] = {"schema": {"type": "string", "description": stream_description}}
    return {200: {"description": "the answer (header X-Gpuq-Job-Id: its job)", "content": content}, **_ERRORS}


_STREAMED = "with stream: true, OpenAI's chunks as server-sent events, ending with `data: [DONE]`"


@router.post("/chat/completions", response_model=None, responses=_answers(_STREAMED))
async def chat_completions(
    body: ChatCompletionCreate,
    call: DropinCallDep,
) -> Response:
    """OpenAI's chat completion, rendered with the model's own chat template."""
    request, db, state, caller, priority, deadline = call
    return await _generate(CHAT, body, request, db, state, caller, priority, deadline)


@router.post("/completions", response_model=None, responses=_answers(_STREAMED))
async def completions(
    body: CompletionCreate,
    call: DropinCallDep,
) -> Response:
    """OpenAI's (legacy) text completion: the prompt as given, no chat template."""
    request, db, state, caller, priority, deadline = call
    return await _generate(COMPLETIONS, body, request, db, state, caller, priority, deadline)


@router.post("/embeddings", response_model=None, responses=_answers(None))
async def embeddings(
    body: EmbeddingCreate,
    call: DropinCallDep,
) -> Response:
    """Mean-pooled, L2-normalised vectors; `encoding_format` float or base64, `dimensions` to shorten them."""
    request, db, state, caller, priority, deadline = call
    job_request = body.to_request()
    model = await find_model(db, body.model, not_found=openai.not_found(body.model))
    await check_dimensions(model, body.dimensions)
    chosen = call_priority(priority, caller)
    spec = call_spec(JobKind.EMBED, body.model, job_request, priority=chosen, stream=False, deadline=deadline)
    job = await calls.submit(db, state, caller, spec)
    final = await _final(request, state, job)
    if final is None:
        return Response(status_code=calls.CLIENT_GONE)
    answer = openai.answer(EMBEDDINGS, final, encoding_format=body.encoding_format, dimensions=body.dimensions)
    return JSONResponse(answer, headers={JOB_ID_HEADER: job.id})


async def _generate(
    endpoint: str,
    body: ChatCompletionCreate | CompletionCreate,
    request: Request,
    db: SessionDep,
    state: StateDep,
    caller: Caller,
    priority: str | None,
    deadline: datetime | None,
) -> Response:
    model = await find_model(db, body.model, not_found=openai.not_found(body.model))
    if isinstance(body, ChatCompletionCreate):
        refuse_more_messages_than_the_context(model, len(body.messages))
    # Off the event loop: a long conversation takes tens of milliseconds to convert.
    job_request = await to_thread.run_sync(body.to_request)
    spec = call_spec(
        JobKind.GENERATE,
        body.model,
        await with_max_tokens(db, state.redis, caller, model, job_request),
        priority=call_priority(priority, caller, service_tier=body.service_tier),
        stream=body.stream,
        deadline=deadline,
    )
    tier = echoed_tier(body.service_tier)
    job = await calls.submit(db, state, caller, spec)
    if body.stream:
        events = calls.events(state, job.id)
        content = openai.stream(events, endpoint, job, include_usage=body.include_usage, service_tier=tier)
        return calls.stream(state, job, content, "text/event-stream")
    final = await _final(request, state, job)
    if final is None:
        return Response(status_code=calls.CLIENT_GONE)
    answer = openai.answer(endpoint, final) | ({"service_tier": tier} if tier else {})
    return JSONResponse(answer, headers={JOB_ID_HEADER: job.id})


async def _final(request: Request, state: StateDep, job: Job) -> Job | None:
    """The job's final row once it succeeded; a 500 (failed) or 409 (cancelled) otherwise."""
    ended = await calls.until_end(request, state, job)
    if ended is None:
        return None
    end, final = ended
    problem = openai.ended_badly(job.id, end)
    if problem is not None:
        raise RequestError(409 if end.status == JobStatus.CANCELLED else 500, problem, code=f"job_{end.status}")
    return final
