"""The webhook delivery log."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    WebhookDelivery,
)

# ---------------------------------------------------------------- webhooks


def list_deliveries(
    session: Session, *, job_id: str | None, batch_id: str | None, limit: int, owner: str | None = None
) -> list[WebhookDelivery]:
    """Newest first; ``owner`` narrows to one tenant's deliveries."""
    query = select(WebhookDelivery)
    if owner is not None:
        query = query.where(WebhookDelivery.owner == owner)
    if job_id is not None:
        query = query.where(WebhookDelivery.job_id == job_id)
    if batch_id is not None:
        query = query.where(WebhookDelivery.batch_id == batch_id)
    return list(session.scalars(query.order_by(WebhookDelivery.created_at.desc()).limit(limit)))
