"""One interactive call of the drop-in APIs (OpenAI's, Anthropic's, Ollama's): an ordinary gpuq job.

The call's job goes through the same limits, placement, queues, slots and history as any
other; only three things differ. Its priority comes from the ``X-Gpuq-Priority`` header,
else its key's default, else ``high`` (someone is waiting); its deadline, if any, from the
``X-Gpuq-Deadline`` header. Its request asks its worker for events (``gpuq.streams``),
which the call follows to answer: token by token when streaming, at the end otherwise. And
a caller that goes away before the end cancels the job, through the same path as
``POST /v1/jobs/{id}/cancel``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import NamedTuple

import anyio
from anyio import to_thread
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import Job, JobKind, Model, utcnow
from gpuq.errors import RequestError
from gpuq.jobs.admission import DEADLINE_CODE
from gpuq.jobs.cancel import cancel_job
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.limits import precheck, tokenising_turn
from gpuq.jobs.prefix_routing import OFF, PrefixRouting
from gpuq.jobs.prompt import Counted, vocab_tokenizer
from gpuq.jobs.request import JobParams
from gpuq.jobs.submit import JobSpec, refuse_surely_too_long, submit_jobs
from gpuq.queue_names import Priority
from gpuq.streams.events import END_ONLY, REQUEST_FIELD, TOKENS, End, Event

log = logging.getLogger(__name__)

PRIORITY_HEADER = "X-Gpuq-Priority"
DEADLINE_HEADER = "X-Gpuq-Deadline"  # no drop-in body has a field for it; `deadline` on POST /v1/jobs
JOB_ID_HEADER = "X-Gpuq-Job-Id"  # on every drop-in answer: the job behind it, for GET /v1/jobs/{id}


# OpenAI's service tiers as gpuq's priorities; "auto" and "default" leave the key's own.
TIER_PRIORITIES = {"flex": Priority.LOW, "priority": Priority.HIGH}


def call_priority(
    header: str | None, caller: Caller, *, service_tier: str | None = None, default: Priority = Priority.HIGH
) -> Priority:
    """The header's priority, else the one OpenAI's ``service_tier`` asks for (``flex``: low,
    ``priority``: high), else the key's default, else ``default`` (high: someone is waiting; a
    background response's caller is not). A header and a tier that ask for different
    priorities are a 400: which one was meant is not known."""
    tiered = TIER_PRIORITIES.get(service_tier or "")
    if header:
        try:
            chosen = Priority.parse(header.strip())
        except ValueError as exc:
            raise RequestError(400, f"{PRIORITY_HEADER}: {exc}", param=PRIORITY_HEADER) from None
        if tiered is not None and tiered != chosen:
            raise RequestError(
                400,
                f"service_tier {service_tier!r} asks for priority {tiered.label}, but {PRIORITY_HEADER} says "
                f"{chosen.label}: give one of them",
                param="service_tier",
            )
        return chosen
    if tiered is not None:
        return tiered
    return Priority(caller.priority_or(default))


def call_deadline(header: str | None) -> datetime | None:
    """The ``X-Gpuq-Deadline`` header's moment (ISO 8601 with a time zone, in the future), as
    ``deadline`` on ``POST /v1/jobs`` takes it; a 400 for anything else."""
    if header is None or not header.strip():
        return None
    try:
        moment = datetime.fromisoformat(header.strip())
    except ValueError:
        raise RequestError(
            400, f"{DEADLINE_HEADER}: {header!r} is not an ISO 8601 time", param=DEADLINE_HEADER
        ) from None
    if moment.tzinfo is None:
        raise RequestError(
            400, f"{DEADLINE_HEADER}: give it a time zone, e.g. 2026-01-31T12:00:00Z", param=DEADLINE_HEADER
        )
    if moment <= utcnow():
        raise RequestError(
            400, f"{DEADLINE_HEADER}: {moment.isoformat()} has passed: give a time in the future", param=DEADLINE_HEADER
        )
    return moment


def echoed_tier(service_tier: str | None) -> str | None:
    """The tier an answer names, as OpenAI's do (``auto`` runs as ``default``); None when the
    request named none."""
    if service_tier is None:
        return None
    return "default" if service_tier == "auto" else service_tier


def call_spec(
    kind: JobKind,
    model: str,
    request: JobParams | SizedRequest,
    *,
    priority: Priority,
    stream: bool,
    deadline: datetime | None = None,
) -> JobSpec:
    """The job of a call: its request asks for every token (streaming) or only the end."""
    params, counted = request if isinstance(request, SizedRequest) else (request, None)
    params = params.model_copy(update={REQUEST_FIELD: TOKENS if stream else END_ONLY})
    return JobSpec(kind=kind, model=model, priority=priority, params=params, counted=counted, deadline=deadline)


async def find_model(db: AsyncSession, name: str, *, not_found: str) -> Model:
    model = await db.run_sync(store.find_model, name)  # an alias finds its model
    if model is None:
        raise RequestError(404, not_found, param="model", code="model_not_found")
    return model


def refuse_more_messages_than_the_context(model: Model, messages: int) -> None:
    """Before a call's messages are even converted: every message takes at least one token
    (its role's marker), and the answer one more, so a conversation of more messages than
    that cannot fit. A 400 that costs nothing, for the cheapest flood there is."""
    if messages >= model.context_length:
        raise RequestError(
            400,
            f"the conversation has {messages} messages, but {model.name!r} has a context of "
            f"{model.context_length} tokens and each message takes at least one: send fewer messages",
            param="messages",
            code="context_length_exceeded",
        )


class SizedRequest(NamedTuple):
    params: GenerationParams
    counted: Counted | None  # while sizing (None: not yet; submit_jobs counts it)


async def with_max_tokens(
    db: AsyncSession,
    redis: Redis,
    caller: Caller,
    model: Model,
    request: GenerationParams,
    *,
    context: int | None = None,
) -> SizedRequest:
    """A generation request without ``max_tokens`` may fill what its context leaves after the
    prompt, as OpenAI and Ollama allow; ``context`` narrows the model's (Ollama's num_ctx),
    and then an explicit ``max_tokens`` must fit it too.

    Counting the prompt's tokens is the call's costly step, so first a key over its limits
    is refused, and a prompt that cannot fit at the fewest tokens its size allows; then it is
    counted once, in the tenant's turn (gpuq/jobs/limits.py), and the count goes with the
    job's spec so that submitting does not count it again."""
    limit = model.context_length if context is None else context
    wanted = request.max_tokens
    if wanted is not None and limit == model.context_length:
        return SizedRequest(request, None)
    if not model.can_generate:
        return SizedRequest(request.model_copy(update={"max_tokens": wanted or 1}), None)  # submit refuses the kind
    await precheck(db, redis, caller, queued_jobs=1, submissions=1)
    room = limit - (wanted or 1)  # the most prompt tokens the call can have

    def count() -> Counted:
        tokenizer = vocab_tokenizer(model.path)
        refuse_surely_too_long(tokenizer, request, wanted or 1, limit, model.name)
        return tokenizer.count_up_to(request, room)

    try:
        async with tokenising_turn(caller.owner):
            counted = await to_thread.run_sync(count)
    except RequestError as exc:  # gpuq's 422, a 400 on the drop-in routes
        raise RequestError(400, exc.message, param=exc.param, code=exc.code) from None
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None
    prompt_tokens = counted.tokens
    if not counted.exact:
        raise RequestError(
            400,
            f"the prompt is at least {prompt_tokens} tokens (counted from its start), but {model.name!r} has a "
            f"context of {limit} tokens and the answer needs {wanted or 1} at least: shorten the prompt",
            param="messages" if request.messages is not None else "prompt",
            code="context_length_exceeded",
        )
    if wanted is not None and prompt_tokens + wanted > limit:
        raise RequestError(
            400,
            f"the prompt is {prompt_tokens} tokens and num_predict is {wanted}, {prompt_tokens + wanted} in all, "
            f"but num_ctx is {limit}: shorten the prompt, lower num_predict or raise num_ctx",
            param="options.num_ctx",
            code="context_length_exceeded",
        )
    filled = wanted if wanted is not None else max(1, limit - prompt_tokens)
    return SizedRequest(request.model_copy(update={"max_tokens": filled}), counted)


async def submit_call(
    db: AsyncSession,
    redis: Redis,
    caller: Caller,
    spec: JobSpec,
    *,
    timeout_s: int,
    worker_slots: int,
    routing: PrefixRouting = OFF,
) -> Job:
    """Queue the call's job as ``POST /v1/jobs`` would. Refusals are 400s, as OpenAI and Ollama
    answer a request they cannot run (gpuq's own API says 422); a deadline the fleet cannot
    meet stays a 429, naming the header the call gave it in. ``submit_jobs`` applies the
    key's limits once every check has passed: one submission per call, none for a refused one."""
    try:
        [accepted] = await submit_jobs(
            db, redis, [spec], timeout_s=timeout_s, caller=caller, worker_slots=worker_slots, routing=routing
        )
    except RequestError as exc:
        if exc.code == DEADLINE_CODE:
            raise RequestError(
                exc.status, exc.message, param=DEADLINE_HEADER, code=exc.code, headers=exc.headers
            ) from None
        if exc.status != 422:
            raise
        raise RequestError(400, exc.message, param=exc.param, code=exc.code, headers=exc.headers) from None
    return accepted.job


async def abandon(sessions: async_sessionmaker[AsyncSession], redis: Redis, job_id: str) -> None:
    """The caller went away before the end: its job is cancelled (queued: at once; running: at
    its next token). Shielded, since it runs while the call itself is being cancelled."""
    with anyio.CancelScope(shield=True):
        try:
            async with sessions() as db:
                job = await cancel_job(db, redis, job_id)
            log.info("caller of job %s went away; job %s", job_id, job.status)
        except RequestError:
            pass  # it ended meanwhile
        except Exception:
            log.exception("could not cancel job %s, whose caller went away", job_id)


async def wait_for_end(events: AsyncIterator[Event], client_gone: Callable[[], Awaitable[None]]) -> End | None:
    """The job's end, or None if the client went away first."""
    end: End | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            await client_gone()
            group.cancel_scope.cancel()

        group.start_soon(watch)
        async for event in events:
            if isinstance(event, End):
                end = event
        group.cancel_scope.cancel()
    return end
