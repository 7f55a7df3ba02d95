"""Shared pieces of the request and response shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema

from gpuq.jobs.request import MAX_CONTEXT_TOKENS as MAX_CONTEXT_TOKENS
from gpuq.jobs.request import MAX_EMBED_INPUTS as MAX_EMBED_INPUTS
from gpuq.jobs.request import MAX_STOP_SEQUENCES as MAX_STOP_SEQUENCES
from gpuq.queue_names import Priority

# The largest value an INTEGER column holds on PostgreSQL (SQLite's go further): the bound
# of every integer a request stores or looks up, so a larger one is a 422, not a 500.
MAX_SQL_INT = 2**31 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _priority(value: object) -> Priority:
    if isinstance(value, Priority):
        return value
    if not isinstance(value, str):
        raise ValueError("give a priority by name: high, normal or low")
    return Priority.parse(value)  # raises ValueError naming the choices


# A priority as users write it (high, normal or low, any case), parsed once, where the
# request is read, into the enum the rest of gpuq uses; shown by name again in responses.
PriorityName = Annotated[
    Priority,
    PlainValidator(_priority),
    PlainSerializer(lambda p: p.label, return_type=str),
    WithJsonSchema({"type": "string", "enum": [p.label for p in Priority]}),
]


class ErrorObject(BaseModel):
    """OpenAI's error object, which the ``openai`` SDK reads."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every refusal on gpuq's and the OpenAI-compatible routes (api/errors.py)."""

    detail: str = Field(description="what is wrong and what to fix")
    error: ErrorObject


class OllamaErrorBody(BaseModel):
    """Every refusal on Ollama's routes (``/api/...``), the shape Ollama's clients read."""

    error: str


def unix_time(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None
