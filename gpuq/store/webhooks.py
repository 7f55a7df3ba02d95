"""Webhook deliveries: the log of events to send, their claims and their attempts.

The sending (signing, the POST, the backoff) is ``gpuq.batches.webhooks``'s.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import DeliveryStatus, WebhookDelivery, utcnow
from gpuq.store._sql import rows_changed


def new_delivery(
    event: str,
    url: str,
    payload: dict[str, Any],
    *,
    job_id: str | None = None,
    batch_id: str | None = None,
    owner: str | None = None,
) -> WebhookDelivery:
    """A pending delivery, due now, for the caller to add in the transaction of the change it reports."""
    now = utcnow()
    return WebhookDelivery(
        id=f"whd_{secrets.token_hex(10)}",
        event=event,
        url=url,
        job_id=job_id,
        batch_id=batch_id,
        owner=owner,
        payload=payload,
        status=DeliveryStatus.PENDING.value,
        attempts=0,
        next_attempt_at=now,
        created_at=now,
    )


def _claim(session: Session, delivery: WebhookDelivery, now: datetime, claim_for: timedelta) -> bool:
    changed = rows_changed(
        session,
        update(WebhookDelivery)
        .execution_options(synchronize_session=False)
        .where(
            WebhookDelivery.id == delivery.id,
            WebhookDelivery.attempts == delivery.attempts,
            WebhookDelivery.status == DeliveryStatus.PENDING,
        )
        .values(attempts=delivery.attempts + 1, next_attempt_at=now + claim_for),
    )
    session.commit()
    return bool(changed)


def claim_due_deliveries(session: Session, *, now: datetime, limit: int, claim_for: timedelta) -> list[str]:
    """Claim up to ``limit`` pending deliveries due at ``now`` for one attempt each (an attempt
    counted, not due again for ``claim_for``); returns the ids claimed. Each claim is a
    conditional UPDATE: one another scheduler won is left out."""
    due = session.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(limit)
    ).all()
    return [delivery.id for delivery in due if _claim(session, delivery, now, claim_for)]


def delivery_to_send(session: Session, delivery_id: str) -> WebhookDelivery | None:
    """A claimed delivery as the database has it now (None once deleted)."""
    return session.get(WebhookDelivery, delivery_id, populate_existing=True)


def record_delivered(session: Session, delivery: WebhookDelivery, *, status_code: int | None, at: datetime) -> None:
    delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED.value, at
    delivery.last_status_code, delivery.last_error = status_code, None
    session.commit()


def record_delivery_retry(
    session: Session, delivery: WebhookDelivery, *, status_code: int | None, error: str | None, at: datetime
) -> None:
    """A failed attempt, to be made again from ``at``."""
    delivery.last_status_code, delivery.last_error, delivery.next_attempt_at = status_code, error, at
    session.commit()


def record_delivery_failed(
    session: Session, delivery: WebhookDelivery, *, status_code: int | None, error: str | None
) -> None:
    """A delivery given up for good."""
    delivery.status = DeliveryStatus.FAILED.value
    delivery.last_status_code, delivery.last_error = status_code, error
    session.commit()


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
