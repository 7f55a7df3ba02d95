"""Anthropic's Messages API and Message Batches: the bodies gpuq takes and the objects it answers.

The request bodies are gpuq/batches/anthropic_format.py's (one parser for the route and for
a batch's ``params``); these are the answers as the OpenAPI document declares them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from api.schemas.common import PriorityName
from gpuq.batches.anthropic_format import CountTokensCreate, MessageCreate
from gpuq.batches.message_batches import MAX_REQUESTS

__all__ = [
    "AnthropicError",
    "AnthropicErrorBody",
    "AnthropicMessage",
    "CountTokensCreate",
    "InputTokens",
    "MessageBatch",
    "MessageBatchCreate",
    "MessageBatchDeleted",
    "MessageBatchOptions",
    "MessageBatches",
    "MessageCreate",
]


class AnthropicError(BaseModel):
    type: Literal[
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    ]
    message: str


class AnthropicErrorBody(BaseModel):
    """Every refusal on Anthropic's routes (``/v1/messages...``), the shape the anthropic SDK reads."""

    type: Literal["error"] = "error"
    error: AnthropicError


class MessageUsage(BaseModel):
    input_tokens: int = Field(description="prompt tokens evaluated (those read from the cache are apart)")
    output_tokens: int
    cache_read_input_tokens: int = Field(description="prompt tokens the worker reused from its cache")
    cache_creation_input_tokens: int = Field(description="always 0: gpuq caches prompt starts unasked")


class MessageContentBlock(BaseModel):
    """A ``text`` block (``text``) or a ``tool_use`` block (``id``, ``name``, ``input``)."""

    type: Literal["text", "tool_use"]
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class AnthropicMessage(BaseModel):
    id: str = Field(description="msg_<job id>: the gpuq job that answered (GET /v1/jobs/{id})")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[MessageContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None
    usage: MessageUsage


class InputTokens(BaseModel):
    input_tokens: int


class MessageBatchRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # checked with the params, naming the request
    custom_id: str = Field(description="1 to 64 letters, digits, _ or -; unique in the batch")
    params: dict[str, Any] = Field(description="a Messages request (POST /v1/messages's body), not streamed")


class MessageBatchOptions(BaseModel):
    """A Message Batch's fields beside its requests (the route reads the requests one at a
    time, gpuq/batches/message_batch_body.py)."""

    model_config = ConfigDict(extra="forbid")
    priority: PriorityName = Field(
        "low", validate_default=True, description="gpuq extension: batches default below interactive jobs"
    )
    webhook_url: HttpUrl | None = Field(None, description="gpuq extension: POSTed a signed event when it ends")


class MessageBatchCreate(MessageBatchOptions):
    """Up to 100,000 Messages requests, each named by its custom_id, run as one batch."""

    requests: list[MessageBatchRequest] = Field(min_length=1, max_length=MAX_REQUESTS)


class MessageBatchRequestCounts(BaseModel):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    created_at: str
    expires_at: str
    ended_at: str | None
    cancel_initiated_at: str | None
    archived_at: None = None
    results_url: str | None = Field(description="once ended; GET it before for the results answered so far")


class MessageBatches(BaseModel):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class MessageBatchDeleted(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"
