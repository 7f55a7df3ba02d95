"""Shared pieces of the request and response shapes."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

MAX_CONTEXT_TOKENS = 1 << 20
MAX_EMBED_INPUTS = 2048
MAX_STOP_SEQUENCES = 4


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    detail: str


def unix_time(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None
