"""/v1/webhooks: the delivery log of job and batch webhooks."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CallerDep, SessionDep
from api.schemas import DeliveriesPublic, DeliveryPublic
from gpuq import store

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.get("/deliveries", response_model=DeliveriesPublic)
async def list_deliveries(
    db: SessionDep,
    caller: CallerDep,
    job_id: str | None = None,
    batch_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> DeliveriesPublic:
    """Newest first: each event with its attempts, last HTTP status or error, and outcome.
    Submitters see their own tenant's deliveries."""
    rows = await db.run_sync(
        lambda s: store.list_deliveries(s, job_id=job_id, batch_id=batch_id, limit=limit, owner=caller.tenant_filter)
    )
    return DeliveriesPublic(data=[DeliveryPublic.of(d) for d in rows])
