"""API keys: creating one (the secret is in that response only) and listing them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.schemas.common import MAX_SQL_INT, PriorityName, Strict
from gpuq.db.tables import ApiKey, Role
from gpuq.jobs.fair import MAX_WEIGHT
from gpuq.queue_names import Priority


class KeyCreate(Strict):
    name: str = Field(min_length=1, max_length=128, description="what the key is for, e.g. 'nightly-evals'")
    owner: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$", description="the tenant it acts for")
    role: Role = Role.SUBMITTER
    max_queued_jobs: int | None = Field(
        None, ge=1, le=MAX_SQL_INT, description="jobs it may have queued at once; null: no limit"
    )
    max_submissions_per_minute: int | None = Field(
        None, ge=1, le=MAX_SQL_INT, description="jobs (or batches) it may submit a minute; null: no limit"
    )
    default_priority: PriorityName | None = Field(
        None,
        description="priority of its jobs and interactive calls (OpenAI, Ollama) that name none; "
        "null: normal for jobs, high for interactive calls",
    )
    weight: int = Field(
        1,
        ge=1,
        le=MAX_WEIGHT,
        description="its tenant's share of the fleet beside other tenants' jobs of the same priority "
        "(2 gets twice the jobs of 1 while both wait); a tenant weighs as its heaviest active key",
    )


class KeyUpdate(Strict):
    weight: int = Field(ge=1, le=MAX_WEIGHT, description="its tenant's share beside other tenants (see KeyCreate)")


class KeyPublic(BaseModel):
    id: str
    name: str
    owner: str
    role: Role
    prefix: str = Field(description="the secret's first characters, to recognise it")
    max_queued_jobs: int | None
    max_submissions_per_minute: int | None
    default_priority: PriorityName | None
    weight: int = Field(description="its tenant's share of the fleet within a priority (fair shares)")
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, key: ApiKey) -> KeyPublic:
        return cls(
            id=key.id,
            name=key.name,
            owner=key.owner,
            role=Role(key.role),
            prefix=key.key_prefix,
            max_queued_jobs=key.max_queued_jobs,
            max_submissions_per_minute=key.max_submissions_per_minute,
            default_priority=Priority(key.default_priority) if key.default_priority is not None else None,
            weight=key.weight,
            created_at=key.created_at,
            last_used_at=key.last_used_at,
            revoked_at=key.revoked_at,
        )


class KeyCreated(KeyPublic):
    key: str = Field(description="the secret: shown in this response only, store it now")


class KeyListed(KeyPublic):
    jobs_last_hour: int = Field(description="jobs submitted with it in the past hour (a batch's lines each count)")
    tokens_last_hour: int = Field(description="prompt and completion tokens of those jobs that have finished")


class KeysPublic(BaseModel):
    data: list[KeyListed]
