"""/v1/jobs: submit, read, list and cancel jobs."""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Response, status
from redis.exceptions import RedisError

from api.deps import CallerDep, SessionDep, StateDep, visible_job
from api.errors import errors
from api.schemas import JobCreate, JobPosition, JobPublic, JobsAccepted, JobsCreate, JobsPublic, JobSummary
from api.schemas.common import PriorityName
from api.schemas.jobs import EmbedJobCreate, GenerateJobCreate, NoopJobCreate
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import Job, JobKind, JobStatus
from gpuq.errors import RequestError
from gpuq.jobs.cancel import cancel_job
from gpuq.jobs.position import job_position_async
from gpuq.jobs.request import JobParams
from gpuq.jobs.submit import JobSpec, submit_jobs
from gpuq.queue_names import Priority
from gpuq.streams.events import wants_tokens
from gpuq.streams.progress import tokens_streamed

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _spec(body: GenerateJobCreate | EmbedJobCreate | NoopJobCreate, caller: Caller) -> JobSpec:
    """A job that names no priority gets its key's default priority, if the key has one."""
    spec = body.to_spec()
    if "priority" in body.model_fields_set:
        return spec
    return replace(spec, priority=Priority(caller.priority_or(spec.priority)))


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses=errors(
        404,
        409,
        429,
        503,
        other={200: {"model": JobPublic, "description": "An `Idempotency-Key` replay: the first job"}},
    ),
)
async def create_job(
    body: JobCreate,
    db: SessionDep,
    state: StateDep,
    response: Response,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> JobPublic:
    """Queue one job. An `Idempotency-Key` header (or `idempotency_key` field) makes retries safe:
    the same key and body return the first job (200) instead of queueing another."""
    if idempotency_key and body.idempotency_key is None:
        body = body.model_copy(update={"idempotency_key": idempotency_key})
    await state.check_webhook_url(body.webhook_url)
    [accepted] = await submit_jobs(
        db,
        state.redis,
        [_spec(body, caller)],
        timeout_s=state.settings.job_timeout_s,
        caller=caller,
        worker_slots=state.settings.worker_slots,
        routing=state.routing,
    )
    if not accepted.created:
        response.status_code = status.HTTP_200_OK
    return JobPublic.of(accepted.job)


@router.post(
    "/bulk", status_code=status.HTTP_202_ACCEPTED, response_model=JobsAccepted, responses=errors(404, 409, 429, 503)
)
async def create_jobs(body: JobsCreate, db: SessionDep, state: StateDep, caller: CallerDep) -> JobsAccepted:
    """Queue many jobs in one request: all are accepted, or none (the error names the index)."""
    limit = state.settings.max_jobs_per_request
    if len(body.jobs) > limit:
        raise RequestError(422, f"{len(body.jobs)} jobs in one request; at most {limit}")
    for url in {j.webhook_url for j in body.jobs}:
        await state.check_webhook_url(url)
    accepted = await submit_jobs(
        db,
        state.redis,
        [_spec(j, caller) for j in body.jobs],
        timeout_s=state.settings.job_timeout_s,
        caller=caller,
        worker_slots=state.settings.worker_slots,
        routing=state.routing,
    )
    return JobsAccepted(data=[JobPublic.of(a.job) for a in accepted])


@router.get("/{job_id}", response_model=JobPublic, responses=errors(404))
async def read_job(job_id: str, db: SessionDep, caller: CallerDep) -> JobPublic:
    """The job, with every run of it (a job run again after its worker died shows both)."""
    job = await visible_job(db, caller, job_id)
    return JobPublic.of(job, runs=await db.run_sync(store.runs_of_job, job_id))


@router.get("/{job_id}/position", response_model=JobPosition, responses=errors(404))
async def read_position(job_id: str, db: SessionDep, state: StateDep, caller: CallerDep) -> JobPosition:
    """A queued job's place: jobs ahead of it (in its queue and the higher priorities of its
    model and kind) and an ETA from the model's recent throughput. Other statuses: position null."""
    job = await visible_job(db, caller, job_id)
    position = await job_position_async(db, state.redis, job)  # Redis in a thread, SQL in run_sync
    return JobPosition(**asdict(position))


@router.get("", response_model=JobsPublic)
async def list_jobs(
    db: SessionDep,
    state: StateDep,
    caller: CallerDep,
    status_: Annotated[list[JobStatus] | None, Query(alias="status")] = None,
    model: str | None = None,
    kind: JobKind | None = None,
    priority: Annotated[PriorityName | None, Query(description="high, normal or low")] = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: str | None = None,
    owner: str | None = None,
    host: str | None = None,
    gpu: str | None = None,
    batch_id: str | None = None,
) -> JobsPublic:
    """Newest first. Filters combine; `status` may repeat. Page with `after` = `next_after`.
    Submitters see their own tenant's jobs; admins see all, or one tenant's with `owner`.
    A running job of a streaming call has `tokens_so_far`, read from its token stream."""
    for bound in (created_after, created_before):
        if bound is not None and bound.tzinfo is None:
            raise RequestError(422, "created_after/created_before need a time zone, e.g. 2026-01-31T12:00:00Z")
    flt = store.JobFilter(
        statuses=tuple(s.value for s in status_ or ()),
        model=model,
        kind=kind.value if kind else None,
        priority=priority,
        created_after=created_after,
        created_before=created_before,
        owner=caller.owner if not caller.is_admin else owner,
        host=host,
        gpu_uuid=gpu,
        batch_id=batch_id,
    )
    try:
        jobs, has_more = await db.run_sync(lambda s: store.list_jobs(s, flt, limit=limit, after=after))
    except LookupError:
        raise RequestError(422, f"`after` names job {after!r}, which does not exist") from None
    so_far = await _tokens_so_far(state, jobs)
    return JobsPublic(
        data=[JobSummary.listed(j, so_far.get(j.id)) for j in jobs],
        has_more=has_more,
        next_after=jobs[-1].id if has_more else None,
    )


async def _tokens_so_far(state: StateDep, jobs: list[Job]) -> dict[str, int]:
    """Running jobs' tokens from their streams; none while Redis is down (the list is SQL's)."""
    streaming = [
        j.id for j in jobs if j.status == JobStatus.RUNNING and wants_tokens(JobParams.from_stored(j.request).events)
    ]
    try:
        return await to_thread.run_sync(lambda: tokens_streamed(state.redis, streaming)) if streaming else {}
    except RedisError:
        return {}


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses=errors(404, 409, other={202: {"model": JobPublic, "description": "Running: it stops at its next token"}}),
)
async def cancel(job_id: str, db: SessionDep, state: StateDep, response: Response, caller: CallerDep) -> JobPublic:
    """A queued job is cancelled at once (200); a running one stops at its next token (202)."""
    await visible_job(db, caller, job_id)
    job = await cancel_job(db, state.redis, job_id)
    if job.status == JobStatus.RUNNING:
        response.status_code = status.HTTP_202_ACCEPTED
    return JobPublic.of(job)
