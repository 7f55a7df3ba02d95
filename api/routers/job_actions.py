"""/v1/jobs: retry and requeue one job; retry or cancel every job a filter selects.

Owners may retry their own jobs and bulk-act on their own tenant's; requeue is an admin's
tool for a lost queue entry or a stuck worker. See gpuq/job_actions.py for the semantics.
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import AdminDep, CallerDep, SessionDep, StateDep, visible_job
from api.errors import errors
from api.schemas import JobPublic
from api.schemas.job_actions import BulkResult, JobSelection, Requeued
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.errors import RequestError
from gpuq.jobs import actions as job_actions
from gpuq.store.job_actions import CANCELLABLE, RETRYABLE

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _filter(body: JobSelection, caller: Caller, *, allowed: tuple[str, ...], action: str) -> store.JobFilter:
    statuses = tuple(s.value for s in body.status) if body.status else allowed
    wrong = sorted(set(statuses) - set(allowed))
    if wrong:
        raise RequestError(
            422, f"status {', '.join(wrong)}: only {' or '.join(allowed)} jobs can be {action}; nothing was changed"
        )
    if body.owner is not None and not caller.is_admin and body.owner != caller.owner:
        raise RequestError(403, f"owner {body.owner!r}: a submitter key acts only on its own tenant's jobs")
    return store.JobFilter(
        statuses=statuses,
        model=body.model,
        kind=body.kind.value if body.kind else None,
        priority=body.priority,
        created_after=body.created_after,
        created_before=body.created_before,
        owner=body.owner if caller.is_admin else caller.owner,
    )


@router.post("/retry", response_model=BulkResult, responses=errors(403, 503))
async def retry_many(body: JobSelection, db: SessionDep, state: StateDep, caller: CallerDep) -> BulkResult:
    """Retry every failed (default) or cancelled job the filter selects, at most 10,000 a call."""
    flt = _filter(body, caller, allowed=RETRYABLE, action="retried")
    outcome = await job_actions.retry_matching(db, state.redis, flt, timeout_s=state.settings.job_timeout_s)
    return BulkResult(matched=outcome.matched, changed=outcome.changed)


@router.post("/cancel", response_model=BulkResult, responses=errors(403))
async def cancel_many(body: JobSelection, db: SessionDep, state: StateDep, caller: CallerDep) -> BulkResult:
    """Cancel every queued or running job the filter selects (running ones stop at their next token)."""
    flt = _filter(body, caller, allowed=CANCELLABLE, action="cancelled")
    outcome = await job_actions.cancel_matching(db, state.redis, flt)
    return BulkResult(matched=outcome.matched, changed=outcome.changed)


@router.post(
    "/{job_id}/retry", status_code=status.HTTP_202_ACCEPTED, response_model=JobPublic, responses=errors(404, 409, 503)
)
async def retry(job_id: str, db: SessionDep, state: StateDep, caller: CallerDep) -> JobPublic:
    """Queue a failed or cancelled job again, same id, as a fresh run (attempts kept)."""
    job = await visible_job(db, caller, job_id)
    return JobPublic.of(await job_actions.retry_job(db, state.redis, job, timeout_s=state.settings.job_timeout_s))


@router.post(
    "/{job_id}/requeue",
    response_model=Requeued,
    responses=errors(
        403, 404, 409, 503, other={202: {"model": Requeued, "description": "A running job taken back from its worker"}}
    ),
)
async def requeue(job_id: str, db: SessionDep, state: StateDep, caller: AdminDep, response: Response) -> Requeued:
    """Queued: push its Redis entry again if it was lost. Running: take it back from its
    (stuck) worker, which is told to stop, and queue it again (202)."""
    job = await visible_job(db, caller, job_id)
    was_running = job.status == "running"
    requeued, action = await job_actions.requeue_job(db, state.redis, job, timeout_s=state.settings.job_timeout_s)
    if was_running:
        response.status_code = status.HTTP_202_ACCEPTED
    return Requeued(job=JobPublic.of(requeued), action=action)
