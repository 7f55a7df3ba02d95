"""What the drop-in routers (OpenAI's, Anthropic's and Ollama's APIs) share: the headers every
call takes, and answering a call from its job's events, as a stream or once the job ended,
while watching for a client that goes away, which cancels the job.

Starlette notices a vanished client only when a write fails, and a call may write nothing
for minutes (its job is queued). So both answers also listen on the ASGI channel, which
says ``http.disconnect`` the moment the client closes its connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Annotated, NamedTuple

import anyio
from fastapi import Depends, Header, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.types import Receive, Scope, Send

from api.deps import AppState, CallerDep, SessionDep, StateDep
from api.large_bodies import end_turn
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import Job
from gpuq.dropin.call import (
    DEADLINE_HEADER,
    JOB_ID_HEADER,
    PRIORITY_HEADER,
    abandon,
    call_deadline,
    submit_call,
    wait_for_end,
)
from gpuq.jobs.submit import JobSpec
from gpuq.streams.events import End, Event
from gpuq.streams.follow import follow_job

PriorityHeader = Annotated[
    str | None,
    Header(alias=PRIORITY_HEADER, description="high, normal or low; default: the key's default priority, else high"),
]

# On every drop-in route: none of their bodies (OpenAI's, Anthropic's, Ollama's) has a field for it.
DeadlineHeader = Annotated[
    str | None,
    Header(
        alias=DEADLINE_HEADER,
        description="when the answer is needed by (ISO 8601 with a time zone), as `deadline` on POST /v1/jobs: "
        "earliest first among the tenant's jobs of its priority; a call the fleet cannot answer by then is "
        "refused (429 with Retry-After; code deadline_unreachable in OpenAI's error shape)",
    ),
]


class DropinCall(NamedTuple):
    """What every drop-in route takes besides its body (a route unpacks it in this order)."""

    request: Request
    db: AsyncSession
    state: AppState
    caller: Caller
    priority: str | None  # the X-Gpuq-Priority header
    deadline: datetime | None  # the X-Gpuq-Deadline header's moment


def _dropin_call(
    request: Request,
    db: SessionDep,
    state: StateDep,
    caller: CallerDep,
    priority: PriorityHeader = None,
    deadline: DeadlineHeader = None,
) -> DropinCall:
    # Read here for every route alike: a bad deadline is a 400 before the route runs.
    return DropinCall(request, db, state, caller, priority, call_deadline(deadline))


DropinCallDep = Annotated[DropinCall, Depends(_dropin_call)]

CLIENT_GONE = 499  # nginx's "client closed request": the status of an answer nobody reads


class CallStream(StreamingResponse):
    """A streamed answer that cancels its job when the client goes away before its end."""

    def __init__(
        self, content: AsyncIterator[bytes], *, on_gone: Callable[[], Awaitable[None]], media_type: str, job_id: str
    ) -> None:
        headers = {JOB_ID_HEADER: job_id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type=media_type, headers=headers)
        self._on_gone = on_gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = False
        async with anyio.create_task_group() as group:

            async def answer() -> None:
                nonlocal finished
                try:
                    await self.stream_response(send)
                    finished = True
                except OSError:  # the client went away mid-write
                    pass
                group.cancel_scope.cancel()

            group.start_soon(answer)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()
        if not finished:
            await self._on_gone()


async def submit(db: AsyncSession, state: AppState, caller: Caller, spec: JobSpec) -> Job:
    """Queues the call's job, then lets the session go: the wait that follows may last
    minutes and holds no database connection."""
    job = await submit_call(
        db,
        state.redis,
        caller,
        spec,
        timeout_s=state.settings.job_timeout_s,
        worker_slots=state.settings.worker_slots,
        routing=state.routing,
    )
    await db.close()
    end_turn()  # the call's costly part is over: its key's next large body may be read
    return job


async def events(state: AppState, job_id: str) -> AsyncIterator[Event]:
    """The job's events; meanwhile the job counts as a call this process answers (api/shutdown.py)."""
    state.calls.add(job_id)
    try:
        async for event in follow_job(state.streams, state.sessions, job_id):
            yield event
    finally:
        state.calls.discard(job_id)


def stream(state: AppState, job: Job, content: AsyncIterator[bytes], media_type: str) -> CallStream:
    return CallStream(
        content, on_gone=lambda: abandon(state.sessions, state.redis, job.id), media_type=media_type, job_id=job.id
    )


async def until_end(request: Request, state: AppState, job: Job) -> tuple[End, Job] | None:
    """The job's end and its final row; None when the client went away first (the job is
    then cancelled)."""

    async def client_gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    end = await wait_for_end(events(state, job.id), client_gone)
    if end is None:
        await abandon(state.sessions, state.redis, job.id)
        return None
    async with state.sessions() as db:
        final = await db.run_sync(store.get_job, job.id)
    return end, final or job
