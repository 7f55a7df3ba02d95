"""/v1/batches: OpenAI-compatible batches, plus gpuq's progress and partial results."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from api.deps import CallerDep, SessionDep, StateDep, visible_batch, visible_file
from api.errors import errors
from api.schemas import BatchCreate, BatchesPublic, BatchObject, BatchProgress
from gpuq import store
from gpuq.batches import service as batches
from gpuq.batches.anthropic_format import MESSAGES
from gpuq.batches.queue_order import Planning
from gpuq.db.tables import Batch
from gpuq.errors import RequestError
from gpuq.jobs.limits import admit_sync, precheck

router = APIRouter(prefix="/v1/batches", tags=["batches"])


async def _object(db: SessionDep, batch: Batch) -> BatchObject:
    counts = await db.run_sync(lambda s: batches.request_counts(s, batch))
    endpoints = await db.run_sync(lambda s: store.batch_endpoints(s, batch.id))
    return BatchObject.of(batch, counts, endpoints or [batch.endpoint])


@router.post("", response_model=BatchObject, responses=errors(404, 429, 503))
async def create_batch(body: BatchCreate, db: SessionDep, state: StateDep, caller: CallerDep) -> BatchObject:
    """Run every line of an uploaded file. Lines are checked first; an invalid one fails the
    request (422, with line numbers) and nothing is created."""
    file = await visible_file(db, caller, body.input_file_id)
    await state.check_webhook_url(body.webhook_url)
    # A key over its limits is refused before its file's lines are checked (spending nothing).
    await precheck(db, state.redis, caller, queued_jobs=file.line_count, submissions=1)

    def start() -> str:
        with state.sync_sessions() as session:
            return batches.start_batch(
                session,
                state.redis,
                input_file_id=body.input_file_id,
                endpoint=body.endpoint,
                completion_window=body.completion_window,
                metadata=body.metadata,
                priority=body.priority,
                timeout_s=state.settings.job_timeout_s,
                webhook_url=str(body.webhook_url) if body.webhook_url else None,
                owner=caller.owner,
                api_key_id=caller.key_id,
                admit=lambda s: admit_sync(s, state.redis, caller, queued_jobs=file.line_count, submissions=1),
                worker_slots=state.settings.worker_slots,
                planning=Planning.of(state.settings),
            ).id

    batch_id = await to_thread.run_sync(start)
    return await _object(db, await visible_batch(db, caller, batch_id))


@router.get("/{batch_id}", response_model=BatchObject, responses=errors(404))
async def read_batch(batch_id: str, db: SessionDep, caller: CallerDep) -> BatchObject:
    return await _object(db, await visible_batch(db, caller, batch_id))


@router.get("", response_model=BatchesPublic)
async def list_batches(
    db: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> BatchesPublic:
    """Newest first; submitters see their own tenant's batches. Message Batches are listed
    at /v1/messages/batches, in Anthropic's shape."""
    try:
        rows, has_more = await db.run_sync(
            lambda s: store.list_batches(s, limit=limit, after=after, owner=caller.tenant_filter, other_than=MESSAGES)
        )
    except LookupError:
        raise RequestError(422, f"`after` names batch {after!r}, which does not exist", param="after") from None
    data = [await _object(db, b) for b in rows]
    return BatchesPublic(
        data=data, has_more=has_more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


@router.post("/{batch_id}/cancel", response_model=BatchObject, responses=errors(404, 409))
async def cancel_batch(batch_id: str, db: SessionDep, state: StateDep, caller: CallerDep) -> BatchObject:
    await visible_batch(db, caller, batch_id)
    await db.run_sync(lambda s: batches.cancel_batch(s, state.redis, batch_id))
    return await _object(db, await visible_batch(db, caller, batch_id))


@router.get("/{batch_id}/progress", response_model=BatchProgress, responses=errors(404))
async def batch_progress(batch_id: str, db: SessionDep, caller: CallerDep) -> BatchProgress:
    """gpuq's own view: input lines per job status, throughput so far and an ETA, the
    schedule whose run started it, how its lines were queued, and how many of the prompt
    tokens run so far came from a cache."""
    batch = await visible_batch(db, caller, batch_id)
    by_status = await db.run_sync(lambda s: store.batch_line_counts(s, batch_id))
    run = await db.run_sync(lambda s: store.schedule_run_of_batch(s, batch_id))
    tokens = await db.run_sync(lambda s: store.batch_prompt_tokens(s, batch_id))
    return BatchProgress.of(batch, by_status, run, tokens)


@router.get(
    "/{batch_id}/results",
    response_class=StreamingResponse,
    responses=errors(
        404, other={200: {"content": {"application/jsonl": {}}, "description": "One output line per answered request"}}
    ),
)
async def batch_results(batch_id: str, db: SessionDep, caller: CallerDep) -> StreamingResponse:
    """The output lines answered so far (successes and errors), as JSONL, while it runs."""
    batch = await visible_batch(db, caller, batch_id)
    lines = await db.run_sync(lambda s: list(batches.results_so_far(s, batch)))
    return StreamingResponse(iter(lines), media_type="application/jsonl")
