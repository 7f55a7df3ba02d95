"""Cron schedules and their runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from api.schemas.batches import BatchEndpoint
from api.schemas.common import PriorityName, Strict
from gpuq.batches.window import ACCEPTED
from gpuq.db.tables import Schedule, ScheduleRun
from gpuq.queue_names import Priority


class ScheduleCreate(Strict):
    name: str = Field(min_length=1, max_length=128)
    cron: str = Field(min_length=1, max_length=128, description="five-field cron, e.g. '0 2 * * *'")
    timezone: str = Field("UTC", description="IANA name the cron is read in, e.g. Europe/Paris")
    input_file_id: str | None = Field(None, description="a stored batch file to run...")
    requests: list[dict[str, Any]] | None = Field(None, min_length=1, description="...or inline batch lines")
    endpoint: BatchEndpoint = Field(
        "/v1/chat/completions", description="the batch's endpoint; lines may name any of these"
    )
    priority: PriorityName = Field("low", validate_default=True)
    enabled: bool = True
    misfire: Literal["skip", "run_once"] = "skip"
    completion_window: str = Field(
        "24h", description=f"each run's batch's window, its lines' deadline from the run's start; {ACCEPTED}"
    )
    owner: str | None = Field(
        None, min_length=1, max_length=128, description="tenant whose batches its runs are; default: yours"
    )

    @model_validator(mode="after")
    def _one_input(self) -> ScheduleCreate:
        if (self.input_file_id is None) == (self.requests is None):
            raise ValueError("give exactly one of `input_file_id` (a stored batch file) or `requests` (inline lines)")
        return self


class SchedulePatch(Strict):
    enabled: bool | None = None
    cron: str | None = Field(None, min_length=1, max_length=128)
    timezone: str | None = None
    misfire: Literal["skip", "run_once"] | None = None
    priority: PriorityName | None = None
    completion_window: str | None = Field(None, description=f"for the runs to come; {ACCEPTED}")


class SchedulePublic(BaseModel):
    id: int
    name: str
    cron: str
    timezone: str
    input_file_id: str | None
    endpoint: str
    priority: str
    enabled: bool
    misfire: str
    completion_window: str = Field(description="each run's batch's completion window")
    next_fire_at: datetime
    last_fired_at: datetime | None
    owner: str | None
    created_at: datetime

    @classmethod
    def of(cls, schedule: Schedule) -> SchedulePublic:
        return cls(
            id=schedule.id,
            name=schedule.name,
            cron=schedule.cron,
            timezone=schedule.timezone,
            input_file_id=schedule.input_file_id,
            endpoint=schedule.endpoint,
            priority=Priority(schedule.priority).label,
            enabled=schedule.enabled,
            misfire=schedule.misfire,
            completion_window=schedule.completion_window,
            next_fire_at=schedule.next_fire_at,
            last_fired_at=schedule.last_fired_at,
            owner=schedule.owner,
            created_at=schedule.created_at,
        )


class SchedulesPublic(BaseModel):
    data: list[SchedulePublic]


class ScheduleRunPublic(BaseModel):
    id: int
    fire_time: datetime
    trigger: str
    batch_id: str | None
    batch_status: str | None
    error: str | None

    @classmethod
    def of(cls, run: ScheduleRun, batch_status: str | None) -> ScheduleRunPublic:
        return cls(
            id=run.id,
            fire_time=run.fire_time,
            trigger=run.trigger,
            batch_id=run.batch_id,
            batch_status=batch_status,
            error=run.error,
        )


class ScheduleRunsPublic(BaseModel):
    data: list[ScheduleRunPublic]


class FireTimes(BaseModel):
    cron: str
    timezone: str
    next: list[datetime]
