"""Worker and GPU events as admins read them (``GET /v1/events``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpuq.db.tables import EventKind, WorkerEvent


class EventPublic(BaseModel):
    id: int
    at: datetime = Field(description="when it happened (a supervisor cut off from the database writes it later)")
    kind: EventKind
    host: str | None
    slot: str | None = Field(description="the supervisor's slot: gpu0, gpu0-mig1, group0+1, cpu0")
    worker: str | None = Field(
        description="the worker's name up to its pid (host.slot.pid): its full name adds a suffix the supervisor "
        "does not know; null for a whole host's drain and for GPU events"
    )
    gpu_uuids: list[str]
    exit_status: int | None = Field(description="how a stopped or crashed worker exited; negative: the signal's number")
    detail: str | None = Field(description="in words: the exit (`crashed: killed by SIGKILL`), the reason, who")

    @classmethod
    def of(cls, event: WorkerEvent) -> EventPublic:
        return cls(
            id=event.id,
            at=event.at,
            kind=EventKind(event.kind),
            host=event.host,
            slot=event.slot,
            worker=event.worker,
            gpu_uuids=[u for u in event.gpu_uuids.split(",") if u],
            exit_status=event.exit_status,
            detail=event.detail,
        )


class EventsPublic(BaseModel):
    data: list[EventPublic]
    has_more: bool
    next_after: int | None = Field(description="pass as `after` for the next page")
