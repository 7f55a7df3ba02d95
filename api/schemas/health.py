"""Liveness and readiness, as load balancers read them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    database: str = Field(description='"ok", or "unreachable: <why>"')
    redis: str = Field(description='"ok", or "unreachable: <why>"')
    disk: str = Field(
        description='"ok", or "full: <bytes free> ..." when the data directory\'s disk has under 1 MiB free'
    )
    workers: str = Field(
        description='"<n> can take jobs", or "none can take jobs: <why>" (no live worker, or all drained: accepted '
        'jobs wait until one can); "unknown" while Redis does not answer. Says nothing of readiness: the API '
        "accepts jobs either way, as it does before the first worker starts"
    )
