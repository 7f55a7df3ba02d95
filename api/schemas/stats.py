"""Stats: what the admin dashboard reads."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpuq.stats.filters import Window
from gpuq.stats.queries import Percentiles, Sums


class StatsWindow(BaseModel):
    since: datetime
    until: datetime


class UsageSums(BaseModel):
    """Sums over finished jobs; ``*_jobs`` say how many jobs had a measured figure (null on CPU
    or simulated GPUs is never counted as zero)."""

    jobs: int
    prompt_tokens: int
    completion_tokens: int
    tokens_per_s: float | None = Field(
        description="per-sequence decode speed: completion tokens over the summed run time of the jobs that made "
        "them (it falls as more sequences decode together); not the fleet's throughput"
    )
    fleet_tokens_per_s: float | None = Field(
        description="throughput: completion tokens per wall-clock second of the window (up to now)"
    )
    gpu_seconds: float
    gpu_seconds_jobs: int
    energy_j: float
    energy_jobs: int

    @classmethod
    def of(cls, s: Sums, window: Window) -> UsageSums:
        fleet = s.fleet_tokens_per_s(window)
        return cls(
            jobs=s.jobs,
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.completion_tokens,
            tokens_per_s=round(s.tokens_per_s, 2) if s.tokens_per_s is not None else None,
            fleet_tokens_per_s=round(fleet, 3) if fleet is not None else None,
            gpu_seconds=round(s.gpu_seconds, 3),
            gpu_seconds_jobs=s.gpu_seconds_jobs,
            energy_j=round(s.energy_j, 3),
            energy_jobs=s.energy_jobs,
        )


class LatencyPercentiles(BaseModel):
    jobs: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    exact: bool = Field(description="false: from daily histograms, within max_relative_error of the exact value")
    max_relative_error: float

    @classmethod
    def of(cls, p: Percentiles) -> LatencyPercentiles:
        v = p.values_ms
        return cls(
            jobs=p.jobs,
            p50_ms=v["p50"],
            p95_ms=v["p95"],
            p99_ms=v["p99"],
            exact=p.exact,
            max_relative_error=p.max_relative_error,
        )


class StatsSummary(BaseModel):
    window: StatsWindow
    finished: dict[str, int] = Field(description="jobs that finished in the window, by final status")
    in_flight: dict[str, int] = Field(description="queued and running now (filters apply, the window does not)")
    usage: UsageSums
    queue_wait: LatencyPercentiles
    run_time: LatencyPercentiles


class ThroughputPointPublic(BaseModel):
    start: datetime
    succeeded: int
    failed: int
    cancelled: int
    jobs_per_min: float
    prompt_tokens: int
    completion_tokens: int
    tokens_per_min: float


class StatsThroughput(BaseModel):
    window: StatsWindow
    bucket_s: int
    data: list[ThroughputPointPublic]


class FailureReasonPublic(BaseModel):
    reason: str
    jobs: int
    latest_job_id: str
    latest_at: datetime


class StatsFailures(BaseModel):
    window: StatsWindow
    failed: int
    data: list[FailureReasonPublic]


class EnergyRow(UsageSums):
    key: str


class StatsEnergy(BaseModel):
    window: StatsWindow
    total: UsageSums
    by_model: list[EnergyRow]
    by_tenant: list[EnergyRow] = Field(description='key "" gathers jobs without a tenant')


class GpuPointPublic(BaseModel):
    start: datetime
    samples: int
    utilization_pct: float | None
    memory_used_mib: float | None
    power_w: float | None
    temperature_c: float | None


class GpuStats(BaseModel):
    uuid: str
    host: str
    live: bool
    loaded_models: list[str]
    usage: UsageSums
    series: list[GpuPointPublic]


class StatsGpus(BaseModel):
    window: StatsWindow
    bucket_s: int
    data: list[GpuStats]


class QueueDepthPublic(BaseModel):
    model: str
    kind: str
    priority: str
    depth: int
    front_job_id: str | None
    front_waiting_s: float | None


class StatsQueues(BaseModel):
    data: list[QueueDepthPublic]


class TenantSharePublic(BaseModel):
    tenant: str = Field(description='the owner of the jobs ("" for jobs of no tenant)')
    queued: int
    running: int
    share_now: float = Field(description="its jobs running now, of all running (0 to 1)")
    finished: int = Field(description="its jobs that finished in the window (a run time recorded)")
    run_s: float = Field(description="their summed run time")
    share_window: float = Field(description="that run time, of all run time of jobs finished in the window (0 to 1)")


class StatsTenants(BaseModel):
    window: StatsWindow
    data: list[TenantSharePublic]


class JobPosition(BaseModel):
    job_id: str
    status: str
    queue: str | None
    position: int | None = Field(description="jobs that run before it (0: next); null unless queued")
    ahead_in_queue: int | None = Field(
        description="jobs of its own priority (its tenant's and, by fair shares, other tenants') that run before it"
    )
    ahead_in_higher_priorities: int | None
    prompt_tokens_ahead: int | None = Field(
        description="prompt tokens of the jobs ahead (as counted at submission; the model's recent mean per job "
        "where a prompt was not counted)"
    )
    completion_tokens_ahead: int | None = Field(
        description="completion tokens the jobs ahead are expected to generate: their max_tokens times n, times the "
        "part of that the model's recent jobs used"
    )
    tokens_per_s: float | None = Field(
        description="prompt and completion tokens the model finished per second of work over the last 15 minutes"
    )
    finished_per_min: float | None
    eta_s: float | None = Field(
        description="seconds until it starts: the tokens ahead at the model's recent tokens per second (jobs per "
        "minute for work without tokens); null if nothing ran lately"
    )
    deadline: datetime | None = Field(description="when it is needed by, if it said")
