"""/api/...: Ollama's API, each generation or embedding a gpuq job.

The ollama client works with ``host`` set to gpuq's address. It sends no key unless told:
``ollama.Client(host="http://gpuq:8000", headers={"Authorization": "Bearer <key>"})`` (or
the OLLAMA_API_KEY variable, which it sends as that header). Refusals are Ollama's
``{"error": "..."}`` (api/errors.py answers so on every /api/ route). Streaming is on by
default, as Ollama's: NDJSON, one object per piece of text, the last with ``done: true``.
"""

from __future__ import annotations

import time
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from api import calls
from api.calls import DropinCall, DropinCallDep
from api.deps import CallerDep, SessionDep, StateDep, get_caller
from api.schemas.ollama import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ProgressResponse,
    PullRequest,
    ShowRequest,
    VersionResponse,
)
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import Job, JobKind
from gpuq.dropin import models, ollama
from gpuq.dropin.call import (
    JOB_ID_HEADER,
    call_priority,
    call_spec,
    find_model,
    refuse_more_messages_than_the_context,
    with_max_tokens,
)
from gpuq.dropin.vectors import check_dimensions, shortened
from gpuq.errors import RequestError
from gpuq.fleet import workers
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.request import EmbeddingParams
from gpuq.streams.events import End

router = APIRouter(prefix="/api", tags=["ollama"])
keyed = [Depends(get_caller)]

NDJSON = "application/x-ndjson"
_ERROR = {"content": {"application/json": {"example": {"error": "model 'x' not found"}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "a field gpuq cannot honour, or a prompt that does not fit", **_ERROR},
    401: {"description": "no valid API key", **_ERROR},
    404: {"description": "the model is not registered", **_ERROR},
    422: {"description": "the body does not have the request's shape", **_ERROR},
    429: {
        "description": "the key is over one of its limits, or the fleet cannot answer by X-Gpuq-Deadline (Retry-After)",
        **_ERROR,
    },
    500: {"description": "the job failed or was cancelled (its error is the message)", **_ERROR},
    503: {"description": "the job queue (Redis) is unavailable", **_ERROR},
}
_STREAMED = {
    200: {
        "description": "NDJSON chunks (stream, the default), or one object with stream: false",
        "content": {NDJSON: {"schema": {"type": "string"}}, "application/json": {}},
    },
    **_ERRORS,
}
_ANSWERED = {200: {"description": "the answer (header X-Gpuq-Job-Id: its job)"}, **_ERRORS}


@router.post("/generate", response_model=None, responses=_STREAMED, dependencies=keyed)
async def generate(
    body: GenerateRequest,
    call: DropinCallDep,
) -> Response:
    """A completion of `prompt` (with `system`), rendered with the model's chat template unless `raw`."""
    return await _generate(body, not body.prompt, call, chat=False)


@router.post("/chat", response_model=None, responses=_STREAMED, dependencies=keyed)
async def chat(
    body: ChatRequest,
    call: DropinCallDep,
) -> Response:
    """The next assistant message of `messages`, rendered with the model's chat template."""
    return await _generate(body, not body.messages, call, chat=True)


@router.post("/embed", response_model=None, responses=_ANSWERED, dependencies=keyed)
async def embed(
    body: EmbedRequest,
    call: DropinCallDep,
) -> Response:
    """L2-normalised vectors of one text or a list; `dimensions` shortens them (normalised again).
    Texts longer than the model's context are refused, not truncated."""
    started = time.perf_counter()
    params = body.params()
    model = await find_model(call.db, body.name, not_found=ollama.not_found(body.model))
    await check_dimensions(model, body.dimensions)
    job, end, final = await _embed(body, params, call)
    if final is None:
        return Response(status_code=calls.CLIENT_GONE)
    vectors = shortened((final.result or {}).get("embeddings", []), body.dimensions)
    figures = {k: v for k, v in ollama.metrics(end, started).items() if k in _EMBED_METRICS}
    return JSONResponse({"model": body.model, "embeddings": vectors, **figures}, headers={JOB_ID_HEADER: job.id})


_EMBED_METRICS = ("total_duration", "load_duration", "prompt_eval_count")


@router.post("/embeddings", response_model=None, responses=_ANSWERED, dependencies=keyed)
async def embeddings(
    body: EmbeddingsRequest,
    call: DropinCallDep,
) -> Response:
    """Ollama's older route: one `prompt`, one vector (normalised, as /api/embed's)."""
    await find_model(call.db, body.name, not_found=ollama.not_found(body.model))
    if not body.prompt:
        return JSONResponse({"embedding": []})
    job, _end, final = await _embed(body, body.params(), call)
    if final is None:
        return Response(status_code=calls.CLIENT_GONE)
    [vector] = (final.result or {}).get("embeddings", [[]])
    return JSONResponse({"embedding": vector}, headers={JOB_ID_HEADER: job.id})


@router.get("/tags", dependencies=keyed, responses={401: _ERRORS[401]})
async def list_tags(db: SessionDep) -> dict[str, Any]:
    """The registered models, in Ollama's list shape."""
    return {"models": await models.tags(db)}


@router.get("/ps", dependencies=keyed, responses={401: _ERRORS[401]})
async def list_loaded(db: SessionDep, state: StateDep, caller: CallerDep) -> dict[str, Any]:
    """Models loaded now. Admins get one entry per worker holding one (with its `worker` and
    `host`) and when each is unloaded if unused (`expires_at`; null while kept forever or in
    its first job); submitters one entry per model, `expires_at` null."""
    return {"models": await models.loaded(db, state.redis, admin=caller.is_admin)}


@router.post("/show", dependencies=keyed, responses={401: _ERRORS[401], 404: _ERRORS[404]})
async def show_model(body: ShowRequest, db: SessionDep) -> dict[str, Any]:
    """A registered model's details, chat template, GGUF metadata and capabilities."""
    model = await find_model(db, body.model_name, not_found=ollama.not_found(body.model or body.name))
    return await models.show(model)


@router.get("/version", response_model=VersionResponse)
@router.head("/version", include_in_schema=False)
async def version(request: Request) -> VersionResponse:
    """gpuq's version (no key needed, as Ollama clients probe it to find the server)."""
    return VersionResponse(version=request.app.version)


@router.post(
    "/pull",
    response_model=ProgressResponse,
    dependencies=keyed,
    responses={
        400: {"description": "the model is not registered: gpuq does not pull models", **_ERROR},
        401: _ERRORS[401],
    },
)
async def pull(body: PullRequest, db: SessionDep) -> ProgressResponse:
    """gpuq does not download models: an admin registers GGUF files. A registered model
    answers success at once (tools that pull before use go on); any other is refused."""
    name = ollama.strip_tag(body.model or body.name)
    if await db.run_sync(store.get_model, name) is not None:
        return ProgressResponse()
    registered = ", ".join(m.name for m in await db.run_sync(store.list_models)) or "none"
    raise RequestError(
        400,
        f"gpuq does not pull models: an admin registers GGUF files already on disk with POST /v1/models "
        f"or `gpuq models register NAME PATH`. {name!r} is not registered; registered: {registered}",
    )


# ---------------------------------------------------------------- shared


async def _generate(body: GenerateRequest | ChatRequest, empty: bool, call: DropinCall, *, chat: bool) -> Response:
    """A generation call; an empty prompt (or no messages) loads or unloads the model, as Ollama's."""
    request, db, state, caller, priority, deadline = call
    started = time.perf_counter()
    model = await find_model(db, body.name, not_found=ollama.not_found(body.model))
    if empty:
        return await _load_or_unload(body.name, body.keep_alive_s(), request, db, state, caller, chat=chat)
    if isinstance(body, ChatRequest):
        refuse_more_messages_than_the_context(model, len(body.messages))
    # Off the event loop: a long conversation takes tens of milliseconds to convert.
    params, context = body.parsed_options().params(
        model, await to_thread.run_sync(body.to_request), body.keep_alive_s()
    )
    spec = call_spec(
        JobKind.GENERATE,
        model.name,
        await with_max_tokens(db, state.redis, caller, model, params, context=context),
        priority=call_priority(priority, caller),
        stream=body.stream,
        deadline=deadline,
    )
    job = await calls.submit(db, state, caller, spec)
    if body.stream:
        content = ollama.stream(calls.events(state, job.id), job.id, body.model, started, chat=chat, tools=params.tools)
        return calls.stream(state, job, content, NDJSON)
    ended = await _ended_well(request, state, job)
    if ended is None:
        return Response(status_code=calls.CLIENT_GONE)
    end, final = ended
    result = final.result or {}
    text, logprobs = result.get("text", ""), result.get("logprobs")
    answer = ollama.final(body.model, end, started, chat=chat, text=text, tools=params.tools, logprobs=logprobs)
    return JSONResponse(answer, headers={JOB_ID_HEADER: job.id})


async def _embed(
    body: EmbedRequest | EmbeddingsRequest, params: EmbeddingParams, call: DropinCall
) -> tuple[Job, Any, Job | None]:
    request, db, state, caller, priority, deadline = call
    spec = call_spec(
        JobKind.EMBED, body.name, params, priority=call_priority(priority, caller), stream=False, deadline=deadline
    )
    job = await calls.submit(db, state, caller, spec)
    ended = await _ended_well(request, state, job)
    if ended is None:
        return job, None, None
    return job, *ended


async def _ended_well(request: Request, state: StateDep, job: Job) -> tuple[End, Job] | None:
    """The job's end and final row once it succeeded (a 500 with its error otherwise); None
    when the client went away first."""
    ended = await calls.until_end(request, state, job)
    if ended is not None:
        problem = ollama.ended_badly(job.id, ended[0])
        if problem is not None:
            raise RequestError(500, problem)
    return ended


async def _load_or_unload(
    name: str,
    keep_alive_s: float | None,
    request: Request,
    db: SessionDep,
    state: StateDep,
    caller: Caller,
    *,
    chat: bool,
) -> Response:
    """Ollama's empty prompt: load the model (a one-token job, so some worker holds it after),
    or, with keep_alive 0, unload it from every worker (an admin's action in gpuq)."""
    done = {"model": name, "created_at": ollama.timestamp(), "done": True}
    if keep_alive_s == 0:
        caller.require_admin()
        live = await to_thread.run_sync(workers.live_workers, state.redis)
        holders = [w.name for w in live if name in w.loaded_models]
        if holders:
            await to_thread.run_sync(lambda: workers.request_unload(state.redis, holders, name))
        return JSONResponse(done | ollama.content("", chat) | {"done_reason": "unload"})
    preload = GenerationParams(prompt="\n", max_tokens=1, temperature=0.0, keep_alive=keep_alive_s)
    spec = call_spec(JobKind.GENERATE, name, preload, priority=call_priority(None, caller), stream=False)
    job = await calls.submit(db, state, caller, spec)
    if await calls.until_end(request, state, job) is None:
        return Response(status_code=calls.CLIENT_GONE)
    return JSONResponse(done | ollama.content("", chat) | {"done_reason": "load"}, headers={JOB_ID_HEADER: job.id})
