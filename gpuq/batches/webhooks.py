"""Webhooks on job and batch completion: signed, retried with backoff, logged in SQL.

An event is first a row (``webhook_deliveries``), written in the same transaction as
the state change it reports, so a crash cannot lose it. The scheduler sends due rows:
each attempt is claimed by a conditional UPDATE (so two schedulers do not both send it),
POSTed with an HMAC-SHA256 signature, and on failure retried after 2, 4, 8 ... seconds
(at most an hour apart) until ``MAX_ATTEMPTS``.

Verifying a delivery (receiver side)::

    expected = hmac.new(secret, f"{timestamp}.".encode() + body, sha256).hexdigest()
    ok = hmac.compare_digest(f"sha256={expected}", request.headers["X-Gpuq-Signature"])

where ``timestamp`` is the ``X-Gpuq-Timestamp`` header (reject old ones to stop replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import DeliveryStatus, WebhookDelivery, utcnow

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
MAX_BACKOFF_S = 3600
TIMEOUT_S = 10.0
CLAIM_S = 60  # an attempt in flight is not picked up again for this long
BATCH_SIZE = 50


def new_delivery(
    event: str,
    url: str,
    payload: dict[str, Any],
    *,
    job_id: str | None = None,
    batch_id: str | None = None,
    owner: str | None = None,
) -> WebhookDelivery:
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


def load_secret(configured: str, data_dir: Path) -> bytes:
    """GPUQ_WEBHOOK_SECRET, or one generated once and kept in the data directory."""
    if configured:
        return configured.encode()
    path = data_dir / "webhook_secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip().encode()


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def backoff_s(attempts: int) -> int:
    return int(min(MAX_BACKOFF_S, 2**attempts))


def _claim(session: Session, delivery: WebhookDelivery, now: datetime) -> bool:
    changed = session.execute(
        update(WebhookDelivery)
        .execution_options(synchronize_session=False)
        .where(
            WebhookDelivery.id == delivery.id,
            WebhookDelivery.attempts == delivery.attempts,
            WebhookDelivery.status == DeliveryStatus.PENDING,
        )
        .values(attempts=delivery.attempts + 1, next_attempt_at=now + timedelta(seconds=CLAIM_S))
    ).rowcount
    session.commit()
    return bool(changed)


def deliver_due(
    session: Session, secret: bytes, *, now: datetime | None = None, client: httpx.Client | None = None
) -> list[str]:
    """Send every delivery that is due; returns the ids delivered this time."""
    now = now or utcnow()
    due = list(
        session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(BATCH_SIZE)
        )
    )
    delivered = []
    own_client = client is None
    client = client or httpx.Client(timeout=TIMEOUT_S)
    try:
        for delivery in due:
            if not _claim(session, delivery, now):
                continue  # another scheduler is sending it
            if _send(session, client, delivery, secret, now):
                delivered.append(delivery.id)
    finally:
        if own_client:
            client.close()
    return delivered


def _send(session: Session, client: httpx.Client, delivery: WebhookDelivery, secret: bytes, now: datetime) -> bool:
    session.refresh(delivery)
    body = json.dumps(
        {"id": delivery.id, "event": delivery.event, "data": delivery.payload}, separators=(",", ":")
    ).encode()
    timestamp = str(int(now.timestamp()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpuq-webhooks",
        "X-Gpuq-Event": delivery.event,
        "X-Gpuq-Delivery": delivery.id,
        "X-Gpuq-Timestamp": timestamp,
        "X-Gpuq-Signature": sign(secret, timestamp, body),
    }
    try:
        response = client.post(delivery.url, content=body, headers=headers)
        delivery.last_status_code, delivery.last_error = response.status_code, None
        ok = response.is_success
        if not ok:
            delivery.last_error = f"HTTP {response.status_code}: {response.text[:200]}"
    except httpx.HTTPError as exc:
        ok, delivery.last_status_code, delivery.last_error = False, None, f"{type(exc).__name__}: {exc}"
    if ok:
        delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED.value, now
    elif delivery.attempts >= MAX_ATTEMPTS:
        delivery.status = DeliveryStatus.FAILED.value
        log.warning("webhook %s to %s failed for good: %s", delivery.id, delivery.url, delivery.last_error)
    else:
        delivery.next_attempt_at = now + timedelta(seconds=backoff_s(delivery.attempts))
    session.commit()
    return ok
