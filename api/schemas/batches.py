"""OpenAI-compatible files and batches, and gpuq's batch progress."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from api.schemas.common import PriorityName, unix_time
from gpuq.db.tables import FINAL_STATUSES, Batch, File, ScheduleRun, utcnow


class FileObject(BaseModel):
    """OpenAI's file object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: None = None

    @classmethod
    def of(cls, file: File) -> FileObject:
        return cls(
            id=file.id,
            bytes=file.bytes,
            created_at=int(file.created_at.timestamp()),
            filename=file.filename,
            purpose=file.purpose,
        )


class FilesPublic(BaseModel):
    """OpenAI's file list (a cursor page: the openai client pages with ``after`` = last id)."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None

    @classmethod
    def of(cls, files: list[File], has_more: bool) -> FilesPublic:
        data = [FileObject.of(f) for f in files]
        return cls(
            data=data, has_more=has_more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
        )


# The endpoints a batch line may name (gpuq/batches/openai_format.py's ENDPOINTS; a test keeps them equal).
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the openai client may add fields gpuq does not use

    input_file_id: str = Field(min_length=1)
    endpoint: BatchEndpoint
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)
    priority: PriorityName = Field(
        "low", validate_default=True, description="gpuq extension: batches default below interactive jobs"
    )
    webhook_url: HttpUrl | None = Field(None, description="gpuq extension: POSTed a signed event when it ends")


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class QueuePlan(BaseModel):
    """gpuq: how the batch's generation lines were queued (docs/architecture.md, 'Batch planning')."""

    lines: int = Field(description="generation lines queued by the plan, grouped by the starts their prompts share")
    groups: int = Field(description="starts that two lines or more share (each line under the longest it shares)")
    slots: int = Field(
        description="the slots of the workers serving the model, all together, it was planned for: a line comes at "
        "least this many places after the line that computes its start (0: nothing shared, file order)"
    )

    @classmethod
    def of(cls, batch: Batch) -> QueuePlan | None:
        if batch.planned_lines is None:
            return None
        return cls(lines=batch.planned_lines, groups=batch.planned_groups or 0, slots=batch.planned_slots or 0)


class BatchObject(BaseModel):
    """OpenAI's batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    owner: str | None = Field(None, description="gpuq: the tenant it belongs to")
    endpoints: list[str] = Field(
        description="gpuq: the endpoints its lines name; a file may mix them, and `endpoint` is its first line's",
    )
    queue_plan: QueuePlan | None = Field(
        None, description="gpuq: the order its generation lines were queued in; null: file order (nothing shared)"
    )

    @classmethod
    def of(cls, batch: Batch, counts: dict[str, int], endpoints: list[str]) -> BatchObject:
        return cls(
            id=batch.id,
            endpoint=batch.endpoint,
            input_file_id=batch.input_file_id,
            completion_window=batch.completion_window,
            status=batch.status,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            created_at=int(batch.created_at.timestamp()),
            in_progress_at=unix_time(batch.in_progress_at),
            expires_at=unix_time(batch.expires_at),
            finalizing_at=unix_time(batch.finalizing_at),
            completed_at=unix_time(batch.completed_at),
            failed_at=unix_time(batch.failed_at),
            expired_at=unix_time(batch.expired_at),
            cancelling_at=unix_time(batch.cancelling_at),
            cancelled_at=unix_time(batch.cancelled_at),
            owner=batch.owner,
            request_counts=RequestCounts(**counts),
            metadata=batch.batch_metadata,
            endpoints=endpoints,
            queue_plan=QueuePlan.of(batch),
        )


class BatchesPublic(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class BatchProgress(BaseModel):
    id: str
    status: str
    total: int
    lines_by_status: dict[str, int]
    lines_per_s: float | None = Field(description="throughput observed since the batch started")
    eta_s: float | None = Field(description="seconds to finish the rest at that throughput")
    schedule_id: int | None = Field(None, description="the schedule whose run started it; null if none did")
    schedule_name: str | None = None
    scheduled_for: datetime | None = Field(None, description="the fire time of that run")
    queue_plan: QueuePlan | None = Field(None, description="the order its generation lines were queued in")
    prompt_tokens: int = Field(0, description="prompt tokens of the generation lines run so far")
    cached_prompt_tokens: int = Field(
        0, description="of those, tokens a worker took from its cache (a KV stream, its prefix cache), not computed"
    )

    @classmethod
    def of(
        cls,
        batch: Batch,
        by_status: dict[str, int],
        run: tuple[ScheduleRun, str] | None = None,
        prompt_tokens: tuple[int, int] = (0, 0),
    ) -> BatchProgress:
        done = sum(n for status, n in by_status.items() if status in FINAL_STATUSES)
        elapsed = (utcnow() - batch.in_progress_at).total_seconds() if batch.in_progress_at else 0.0
        rate = done / elapsed if done and elapsed > 0 else None
        remaining = batch.total - done
        return cls(
            id=batch.id,
            status=batch.status,
            total=batch.total,
            lines_by_status=by_status,
            lines_per_s=round(rate, 3) if rate else None,
            eta_s=round(remaining / rate, 1) if rate and remaining > 0 else (0.0 if remaining == 0 else None),
            schedule_id=run[0].schedule_id if run else None,
            schedule_name=run[1] if run else None,
            scheduled_for=run[0].fire_time if run else None,
            queue_plan=QueuePlan.of(batch),
            prompt_tokens=prompt_tokens[0],
            cached_prompt_tokens=prompt_tokens[1],
        )
