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
