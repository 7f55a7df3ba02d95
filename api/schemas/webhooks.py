"""The webhook delivery log."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from gpuq.db.tables import WebhookDelivery


class DeliveryPublic(BaseModel):
    id: str
    event: str
    url: str
    job_id: str | None
    batch_id: str | None
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> DeliveryPublic:
        return cls.model_validate(delivery, from_attributes=True)


class DeliveriesPublic(BaseModel):
    data: list[DeliveryPublic]
