"""Retry, requeue and bulk actions on jobs."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, field_validator, model_validator

from api.schemas.common import PriorityName, Strict
from api.schemas.jobs import JobPublic
from gpuq.db.tables import JobKind, JobStatus


class JobSelection(Strict):
    """Which jobs a bulk action touches; the fields combine (AND). At least one must be given,
    so an empty body never means every job."""

    status: list[JobStatus] | None = Field(None, min_length=1)
    model: str | None = Field(None, min_length=1, max_length=128)
    kind: JobKind | None = None
    priority: PriorityName | None = Field(None, description="high, normal or low")
    owner: str | None = Field(None, min_length=1, max_length=128, description="admins only; submitters get their own")
    created_after: datetime | None = None
    created_before: datetime | None = None

    @field_validator("created_after", "created_before")
    @classmethod
    def _zoned(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("needs a time zone, e.g. 2026-01-31T12:00:00Z")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> JobSelection:
        if not self.model_fields_set:
            raise ValueError("give at least one filter (status, model, kind, priority, owner, created_after/before)")
        return self


class BulkResult(BaseModel):
    matched: int = Field(description="jobs the filter selects")
    changed: int = Field(description="of those, the jobs this call retried or cancelled")


class Requeued(BaseModel):
    job: JobPublic
    action: str = Field(description="what was done, in words")
