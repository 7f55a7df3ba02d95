"""Workers and hosts as admins see and steer them: state, drain, unload."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.schemas.common import Strict
from gpuq.fleet.prefix_cache_stats import PrefixCacheStats
from gpuq.fleet.workers import LiveWorker, WorkerState


class WorkerPublic(BaseModel):
    name: str
    host: str
    slot: str
    device: str = Field(description="cuda:<uuids>, simulated:<uuid> or cpu")
    gpu_uuids: list[str]
    state: WorkerState = Field(
        description="busy: at least one slot busy; draining: finishing its jobs, then taking no more; "
        "drained: idle and taking nothing"
    )
    slots: int = Field(description="jobs it runs together at most (GPUQ_WORKER_SLOTS; 1 for a worker without slots)")
    slots_busy: int = Field(description="jobs running on it now, as the worker last published at a job's start or end")
    running_jobs: list[str] = Field(description="ids of the jobs running on it now (SQL), by submission")
    current_job: str | None = Field(description="the first of running_jobs, or null; kept for older clients")
    loaded_models: list[str]
    last_heartbeat: datetime | None
    started_at: datetime | None
    jobs_done: int = Field(description="jobs this worker process has run")
    restarts: int = Field(
        description="restarts of its supervisor slot (host and slot) in the events kept: a crashed worker comes "
        "back under a new name with jobs_done at 0, and this says so (GET /v1/events?kind=crashed)"
    )
    drained_by: list[Literal["worker", "host"]] = Field(description="whose drain flag holds it: its own, its host's")
    prefix_cache: PrefixCacheStats | None = Field(
        None,
        description="its prefix cache (prompt starts kept in host RAM and on disk beyond its KV slots), as it last "
        "published at a heartbeat; null before its first",
    )

    @classmethod
    def of(cls, worker: LiveWorker, running_jobs: list[str], restarts: int = 0) -> WorkerPublic:
        flags: tuple[tuple[Literal["worker", "host"], bool], ...] = (
            ("worker", worker.drained_itself),
            ("host", worker.drained_by_host),
        )
        return cls(
            name=worker.name,
            host=worker.host,
            slot=worker.slot,
            device=worker.device,
            gpu_uuids=list(worker.gpu_uuids),
            state=worker.state(running_jobs),
            slots=worker.slots,
            slots_busy=worker.slots_busy,
            running_jobs=running_jobs,
            current_job=running_jobs[0] if running_jobs else None,
            loaded_models=list(worker.loaded_models),
            last_heartbeat=worker.last_heartbeat,
            started_at=worker.birth,
            jobs_done=worker.jobs_done,
            restarts=restarts,
            drained_by=[who for who, on in flags if on],
            prefix_cache=worker.prefix_cache,
        )


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    drained_hosts: list[str] = Field(description="hosts whose workers, present and future, take no jobs")


class HostDrain(BaseModel):
    host: str
    drained: bool
    changed: bool = Field(description="false when the host already was (or was not) drained")
    workers: list[WorkerPublic] = Field(description="the host's live workers, as they are now")


class UnloadRequest(Strict):
    model: str = Field(min_length=1, max_length=128)


class UnloadRequested(BaseModel):
    model: str
    workers: list[str] = Field(description="workers asked to unload it: at once if idle, else after their job")
