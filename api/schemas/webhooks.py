"""The webhook delivery log."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpuq.batches.destinations import redact_url
from gpuq.batches.webhooks import error_class
from gpuq.db.tables import WebhookDelivery


class DeliveryPublic(BaseModel):
    id: str
    event: str
    url: str = Field(description="where it goes, any user name and password shown as ***")
    job_id: str | None
    batch_id: str | None
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None = Field(
        description="what went wrong, as a class: `HTTP 500`, `ConnectTimeout`, `destination refused: ...`; "
        "never what the receiver answered"
    )
    delivered_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> DeliveryPublic:
        shown = cls.model_validate(delivery, from_attributes=True)
        return shown.model_copy(
            update={"url": redact_url(delivery.url), "last_error": error_class(delivery.last_error)}
        )


class DeliveriesPublic(BaseModel):
    data: list[DeliveryPublic]
