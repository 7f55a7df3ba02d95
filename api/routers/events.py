"""/v1/events: what happened to workers and GPUs (started, stopped, crashed with the exit
status or signal, restarted, drained, GPUs marked unhealthy or cleared). Admins only."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import ADMIN_ONLY, SessionDep
from api.errors import errors
from api.schemas.events import EventPublic, EventsPublic
from gpuq import store
from gpuq.db.tables import EventKind
from gpuq.errors import RequestError

MAX_EVENT_ID = 2**63 - 1  # a BIGINT: beyond it, a 422 rather than a database error

router = APIRouter(prefix="/v1/events", tags=["workers"], dependencies=ADMIN_ONLY, responses=errors(403))


@router.get("", response_model=EventsPublic)
async def list_events(
    db: SessionDep,
    kind: Annotated[list[EventKind] | None, Query(description="may repeat")] = None,
    worker: Annotated[str | None, Query(description="a worker's name, or its name up to the pid")] = None,
    host: str | None = None,
    slot: str | None = None,
    gpu: Annotated[str | None, Query(description="a GPU's UUID: its own events and its workers'")] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[int | None, Query(ge=1, le=MAX_EVENT_ID)] = None,
) -> EventsPublic:
    """Newest first. Filters combine. Page with `after` = `next_after`."""
    for bound in (since, until):
        if bound is not None and bound.tzinfo is None:
            raise RequestError(422, "since/until need a time zone, e.g. 2026-01-31T12:00:00Z")
    flt = store.EventFilter(
        kinds=tuple(k.value for k in kind or ()),
        host=host,
        slot=slot,
        worker=worker,
        gpu_uuid=gpu,
        since=since,
        until=until,
    )
    try:
        events, has_more = await db.run_sync(lambda s: store.list_events(s, flt, limit=limit, after=after))
    except LookupError:
        raise RequestError(422, f"`after` names event {after}, which does not exist") from None
    return EventsPublic(
        data=[EventPublic.of(e) for e in events], has_more=has_more, next_after=events[-1].id if has_more else None
    )
