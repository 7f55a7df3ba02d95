"""SQL tables: the system of record. API request/response shapes live in ``api/schemas.py``."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on the way out, on SQLite (which drops the zone) as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSON}


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class JobKind(enum.StrEnum):
    GENERATE = "generate"
    EMBED = "embed"
    NOOP = "noop"  # the whole dispatch path without a model call: health probes and benchmarks


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(128))
    priority: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))  # unique per owner, see below
    request_hash: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)

    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    # The most completion tokens it may generate (max_tokens times n), set at submission: the
    # work waiting is summed from it (null for rows from before migration 0022).
    completion_budget: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)  # of prompt_tokens, not computed: reused
    cached_ram_tokens: Mapped[int | None] = mapped_column(Integer)  # of cached_tokens, from the prefix cache's RAM
    cached_disk_tokens: Mapped[int | None] = mapped_column(Integer)  # ... and from its disk tier
    parked_ms: Mapped[int | None] = mapped_column(Integer)  # time parked for more urgent jobs (preemption)
    # The prompt's tokens as the API built them, for the worker; cleared once the job has run.
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    load_ms: Mapped[int | None] = mapped_column(Integer)
    run_ms: Mapped[int | None] = mapped_column(Integer)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it is needed by: earliest first within its priority and tenant, and refused at
    # submission when the fleet's pace says it cannot finish by then (gpuq/jobs/admission.py).
    deadline: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]

    worker: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(255))
    # Where it ran, as stats filter on it: the worker's host and its (first) GPU.
    host: Mapped[str | None] = mapped_column(String(255))
    gpu_uuid: Mapped[str | None] = mapped_column(String(96))
    attempts: Mapped[int] = mapped_column(Integer, default=0)

    # Who asked: the tenant that owns it and the API key that submitted it (null for rows
    # from before keys existed, which only admins see).
    owner: Mapped[str | None] = mapped_column(String(128))
    api_key_id: Mapped[str | None] = mapped_column(String(40))

    # Measured on a real GPU through NVML while the job ran; null on the CPU or a
    # simulated GPU, where there is nothing to measure.
    gpu_seconds: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)
    # The part of the GPU's energy and time charged to this job, by its share of the tokens
    # decoded while it ran (1.0 alone); null where nothing was measured.
    energy_share: Mapped[float | None] = mapped_column(Float)

    # A job of a batch answers one input line (custom_id), or, for grouped embedding
    # lines, several: their custom_ids are in the request and line_count says how many.
    batch_id: Mapped[str | None] = mapped_column(String(40))
    custom_id: Mapped[str | None] = mapped_column(String(255))
    line_count: Mapped[int] = mapped_column(Integer, default=1)
    line_number: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        Index("ix_jobs_status_priority_created", "status", "priority", "created_at"),
        Index("ix_jobs_model_created", "model", "created_at"),
        Index("ix_jobs_created", "created_at"),
        Index("ix_jobs_batch_status", "batch_id", "status"),
        Index("ix_jobs_owner_created", "owner", "created_at"),
        # Each tenant has its own idempotency keys: another tenant's key is neither a replay
        # nor a conflict.
        Index("uq_jobs_owner_idempotency_key", "owner", "idempotency_key", unique=True),
        Index("ix_jobs_key_status", "api_key_id", "status"),
        Index("ix_jobs_finished", "finished_at"),
        # Stats filtered by where jobs ran, and the failures list (migration 0007).
        Index("ix_jobs_gpu_finished", "gpu_uuid", "finished_at"),
        Index("ix_jobs_host_finished", "host", "finished_at"),
        Index("ix_jobs_status_finished", "status", "finished_at"),
    )

    @property
    def queue_wait_ms(self) -> int | None:
        if self.started_at is None:
            return None
        return int((self.started_at - self.created_at).total_seconds() * 1000)


class RunOutcome(enum.StrEnum):
    """How one run of a job ended: as the job did, or back to its queue (``requeued``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"  # its worker died, handed it back, or an admin requeued it


class JobRun(Base):
    """One run of a job: a claim by a worker, to its outcome or its return to the queue. A job
    that ran twice (its worker died, say) has two rows, whatever ``jobs.attempts`` says (a
    refunded attempt is taken back from that count, never from this history)."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer)  # jobs.attempts as this run's claim counted it
    worker: Mapped[str] = mapped_column(String(255))
    host: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(16))  # a RunOutcome; null while it runs
    reason: Mapped[str | None] = mapped_column(Text)  # the error, or why it went back to the queue
    refunded: Mapped[bool] = mapped_column(default=False)  # its attempt was not charged to the job

    __table_args__ = (Index("ix_job_runs_job", "job_id", "id"),)


class ModelKind(enum.StrEnum):
    GENERATE = "generate"
    EMBED = "embed"


class Model(Base):
    """A registered GGUF file, named as users refer to it in jobs."""

    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    can_generate: Mapped[bool]
    can_embed: Mapped[bool]
    context_length: Mapped[int] = mapped_column(Integer)
    context_length_trained: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    architecture: Mapped[str] = mapped_column(String(64))
    vram_estimate_mib: Mapped[int] = mapped_column(Integer, default=0)
    vram_override_mib: Mapped[int | None] = mapped_column(Integer)
    # What each further GPU of a group pays again (compute buffer, CUDA overhead); None on
    # rows registered before it was estimated.
    vram_per_gpu_mib: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def vram_mib(self) -> int:
        """What placement plans with on one GPU: an admin's measured figure wins over the estimate."""
        return self.vram_override_mib if self.vram_override_mib is not None else self.vram_estimate_mib

    @property
    def kinds(self) -> list[str]:
        """The job kinds it runs, as users name them: ["generate"], ["embed"] or both."""
        return [
            k
            for k, ok in ((ModelKind.GENERATE.value, self.can_generate), (ModelKind.EMBED.value, self.can_embed))
            if ok
        ]

    def supports(self, kind: str) -> bool:
        if kind == JobKind.NOOP:
            return True
        return self.can_generate if kind == JobKind.GENERATE else self.can_embed


class ModelAlias(Base):
    """Another name for a registered model, for clients that insist on one (the `llm` CLI
    sends `text-embedding-3-small`, say): jobs submitted under it run as the model's own."""

    __tablename__ = "model_aliases"

    alias: Mapped[str] = mapped_column(String(128), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Gpu(Base):
    """A GPU some supervisor has seen: the fleet inventory. Live telemetry lives in Redis."""

    __tablename__ = "gpus"

    uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    memory_total_mib: Mapped[int] = mapped_column(Integer)
    simulated: Mapped[bool]
    healthy: Mapped[bool] = mapped_column(default=True)
    unhealthy_reason: Mapped[str | None] = mapped_column(Text)
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class AffinityRule(Base):
    """Where a model may run. See ``gpuq/fleet/affinity.py`` for how rules combine."""

    __tablename__ = "affinity_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_pattern: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str | None] = mapped_column(String(16))
    effect: Mapped[str] = mapped_column(String(8))
    precedence: Mapped[int] = mapped_column(Integer, default=0)
    gpu_indices: Mapped[list[int] | None] = mapped_column(JSON)
    gpu_uuids: Mapped[list[str] | None] = mapped_column(JSON)
    gpu_name_pattern: Mapped[str | None] = mapped_column(String(255))
    host_pattern: Mapped[str | None] = mapped_column(String(255))
    min_memory_mib: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    # Ids are never reused on SQLite either (PostgreSQL's sequences never reuse them): a script
    # holding a deleted rule's id must not hit a newer rule. Migration 0010.
    __table_args__ = ({"sqlite_autoincrement": True},)


class File(Base):
    """An uploaded or produced JSONL file (OpenAI's file object); the bytes live on disk."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    line_count: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Batch(Base):
    """An OpenAI-style batch: one input file, one endpoint, run as ordinary jobs."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer)
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    total: Mapped[int] = mapped_column(Integer)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    webhook_url: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    # Its queue order's plan (gpuq/batches/planning.py); null where nothing was planned.
    planned_lines: Mapped[int | None] = mapped_column(Integer)  # generation lines queued by the plan
    planned_groups: Mapped[int | None] = mapped_column(Integer)  # starts two lines or more share
    planned_slots: Mapped[int | None] = mapped_column(Integer)  # the workers' slots it was planned for

    __table_args__ = (
        Index("ix_batches_status", "status"),
        Index("ix_batches_created", "created_at"),
        Index("ix_batches_owner_created", "owner", "created_at"),
    )


class MisfirePolicy(enum.StrEnum):
    SKIP = "skip"  # ticks missed while no scheduler ran are dropped
    RUN_ONCE = "run_once"  # ... or caught up with a single run


class Schedule(Base):
    """A cron schedule that runs a batch (a stored input file, or inline request lines)."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str | None] = mapped_column(String(40))
    requests: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    endpoint: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(default=True)
    misfire: Mapped[str] = mapped_column(String(16))
    # Each run's batch's window (gpuq/batches/window.py): its lines are needed by the run's
    # start plus this; the server default keeps an older scheduler's inserts valid.
    completion_window: Mapped[str] = mapped_column(String(16), default="24h", server_default="24h")
    next_fire_at: Mapped[datetime]
    last_fired_at: Mapped[datetime | None]
    owner: Mapped[str | None] = mapped_column(String(128))  # its runs' batches belong to this tenant
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = ({"sqlite_autoincrement": True},)  # as affinity rules: ids never reused


class ScheduleRun(Base):
    """One firing of a schedule. Unique per (schedule, fire time): that is what makes a tick
    fire exactly once however many schedulers run."""

    __tablename__ = "schedule_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int] = mapped_column(Integer)
    fire_time: Mapped[datetime]
    trigger: Mapped[str] = mapped_column(String(16))  # "cron", "catch-up" or "manual"
    batch_id: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("schedule_id", "fire_time", name="uq_schedule_runs_tick"),
        {"sqlite_autoincrement": True},
    )


class EventKind(enum.StrEnum):
    """What happened to a worker or a GPU (``worker_events``)."""

    STARTED = "started"  # a worker's first start in its slot
    RESTARTED = "restarted"  # started again after its predecessor in the slot exited
    STOPPED = "stopped"  # exited cleanly (a drain, a refusal of its GPUs, an outage it waits out)
    CRASHED = "crashed"  # exited abnormally: a signal (SIGKILL, SIGABRT) or an error status
    DRAINED = "drained"  # asked to take no more jobs (a worker, or a whole host)
    UNDRAINED = "undrained"
    GPU_UNHEALTHY = "gpu_unhealthy"
    GPU_CLEARED = "gpu_cleared"


class WorkerEvent(Base):
    """A worker's life and its GPUs' health, as it happened: what a restarted worker's fresh
    name and zeroed counts no longer say. Written by supervisors (starts, exits), workers and
    supervisors (GPUs marked unhealthy) and the API (drains, clears)."""

    __tablename__ = "worker_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(16))
    host: Mapped[str | None] = mapped_column(String(255))
    slot: Mapped[str | None] = mapped_column(String(64))
    # The worker's name up to its pid (names are host.slot.pid.xxxx): a supervisor knows the
    # pid it started, not the suffix the worker picks.
    worker: Mapped[str | None] = mapped_column(String(255))
    gpu_uuids: Mapped[str] = mapped_column(Text, default="")  # comma-separated; empty for a CPU worker
    exit_status: Mapped[int | None] = mapped_column(Integer)  # negative: the signal that ended it
    detail: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_worker_events_at", "at"),
        Index("ix_worker_events_slot", "host", "slot", "kind"),
        {"sqlite_autoincrement": True},
    )


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last retry


class WebhookDelivery(Base):
    """One event for one webhook URL, with its delivery attempts: the log owners can read."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str | None] = mapped_column(String(40))
    batch_id: Mapped[str | None] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None]
    owner: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_job", "job_id"),
        Index("ix_webhook_deliveries_batch", "batch_id"),
    )


class Role(enum.StrEnum):
    ADMIN = "admin"  # sees and changes everything
    SUBMITTER = "submitter"  # submits work; sees and cancels only its own tenant's


class ApiKey(Base):
    """An API key. Only a SHA-256 of the secret is stored: the secret is shown once, at creation.

    Keys are 256-bit random strings, so a plain hash is as safe as a slow one here and lets
    a request be authenticated with one indexed lookup.
    """

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))  # enough of the secret to recognise it in a list
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    max_submissions_per_minute: Mapped[int | None] = mapped_column(Integer)
    # The priority of its jobs and interactive calls when a request names none (a Priority
    # value; null: gpuq's defaults).
    default_priority: Mapped[int | None] = mapped_column(Integer)
    # Its tenant's share of the fleet beside other tenants of the same priority: a tenant
    # weighs as its heaviest active key (gpuq/jobs/fair.py).
    weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class GpuSample(Base):
    """A GPU's telemetry at one moment, kept for the utilisation-over-time charts."""

    __tablename__ = "gpu_samples"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96))
    host: Mapped[str] = mapped_column(String(255))
    sampled_at: Mapped[datetime]
    utilization_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_mib: Mapped[int | None] = mapped_column(Integer)
    memory_total_mib: Mapped[int | None] = mapped_column(Integer)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        Index("ix_gpu_samples_gpu_time", "gpu_uuid", "sampled_at"),
        Index("ix_gpu_samples_time", "sampled_at"),
    )


class JobStatsDaily(Base):
    """Finished jobs summed per UTC day and per combination of the stats filters: what long
    stats windows read instead of a million job rows. Rebuilt from ``jobs`` by
    ``gpuq.stats.rollups``; only whole days that ended a grace period ago are rolled up."""

    __tablename__ = "job_stats_daily"

    day: Mapped[datetime] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), primary_key=True)  # "" for jobs without one
    host: Mapped[str] = mapped_column(String(255), primary_key=True)  # "" where it never ran
    gpu_uuid: Mapped[str] = mapped_column(String(96), primary_key=True)  # "" on the CPU
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    jobs: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    run_ms: Mapped[int] = mapped_column(BigInteger)  # of jobs with completion tokens: tokens/s
    generated_run_ms: Mapped[int] = mapped_column(BigInteger)
    gpu_seconds: Mapped[float] = mapped_column(Float)
    gpu_seconds_jobs: Mapped[int] = mapped_column(Integer)  # how many jobs had a figure
    energy_j: Mapped[float] = mapped_column(Float)
    energy_jobs: Mapped[int] = mapped_column(Integer)


class JobLatencyDaily(Base):
    """Histograms of queue wait and run time per UTC day, model, kind and priority, in
    log-spaced bins (``gpuq.stats.rollups.latency_bin``): percentiles of long windows."""

    __tablename__ = "job_latency_daily"

    day: Mapped[datetime] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(8), primary_key=True)  # "wait" or "run"
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    jobs: Mapped[int] = mapped_column(Integer)


class StatsRolledDay(Base):
    """One row per UTC day rolled up into every stats rollup table (written in the same
    transaction): where the rollups end, even over days without a job or a sample."""

    __tablename__ = "stats_rolled_days"

    day: Mapped[datetime] = mapped_column(primary_key=True)


class JobLatencyDimDaily(Base):
    """Queue-wait and run-time histograms per UTC day, per one tenant, host or GPU (``dim``
    "tenant", "host" or "gpu"; jobs without that value are not counted), per model and for
    all models together (``model`` "*", so a filter without a model reads one histogram, not
    one per model): the percentiles of a window filtered by that value, alone or with a model."""

    __tablename__ = "job_latency_dim_daily"

    dim: Mapped[str] = mapped_column(String(8), primary_key=True)
    value: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[datetime] = mapped_column(primary_key=True)
    metric: Mapped[str] = mapped_column(String(8), primary_key=True)  # "wait" or "run"
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    jobs: Mapped[int] = mapped_column(Integer)


class JobStatsHourly(Base):
    """Finished jobs and tokens per UTC hour, model, kind, priority and status: hourly
    throughput charts over days without reading every job row."""

    __tablename__ = "job_stats_hourly"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    jobs: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)


class GpuSampleHourly(Base):
    """``gpu_samples`` per UTC hour and GPU: sums and counts (means stay exact when hours are
    added up) and maxima, for telemetry charts over weeks."""

    __tablename__ = "gpu_samples_hourly"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    utilization_sum: Mapped[float] = mapped_column(Float)
    utilization_n: Mapped[int] = mapped_column(Integer)  # samples that had the figure
    memory_used_max: Mapped[int | None] = mapped_column(Integer)
    power_sum: Mapped[float] = mapped_column(Float)
    power_n: Mapped[int] = mapped_column(Integer)
    temperature_max: Mapped[float | None] = mapped_column(Float)
