"""OpenAI's Responses API: what its routes answer, as the OpenAPI document declares it.

The request body is ``ResponseCreate`` (gpuq/batches/responses_format.py, shared with batch
lines); the items inside ``input`` and ``output`` are OpenAI's, described there and in
gpuq/batches/response_items.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]  # cached_tokens: of input_tokens, those reused from the cache
    output_tokens: int
    output_tokens_details: dict[str, int]  # reasoning_tokens: 0
    total_tokens: int


class ResponseObject(BaseModel):
    """OpenAI's response object; its id is its job's (``resp_<x>`` for ``job_<x>``)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["response"]
    created_at: int
    status: ResponseStatus
    background: bool
    completed_at: int | None
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    model: str
    output: list[dict[str, Any]]
    parallel_tool_calls: bool
    previous_response_id: str | None
    service_tier: str | None = Field(
        None, description="the tier it ran in, when the request named one (auto answers default); else null"
    )
    store: bool
    temperature: float | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: Literal["disabled"]
    usage: ResponseUsage | None


class ResponseItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
