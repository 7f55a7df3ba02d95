"""Request and response shapes of the HTTP API. Tables live in ``gpuq/models.py``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from gpuq.affinity import glob_problem, model_pattern_problem
from gpuq.models import (
    FINAL_STATUSES,
    AffinityRule,
    Batch,
    File,
    Job,
    JobKind,
    Model,
    ModelKind,
    Schedule,
    ScheduleRun,
    WebhookDelivery,
    utcnow,
)
from gpuq.queues import Priority
from gpuq.submit import JobSpec

MAX_CONTEXT_TOKENS = 1 << 20
MAX_EMBED_INPUTS = 2048
MAX_STOP_SEQUENCES = 4


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class JobBase(Strict):
    model: str = Field(min_length=1, max_length=128)
    keep_alive: float | None = Field(
        None,
        ge=-1,
        le=7 * 24 * 3600,
        description="seconds the model stays loaded after this job (as Ollama's keep_alive); -1 forever, 0 unload now",
    )
    priority: str = Field("normal", description="high, normal or low")
    idempotency_key: str | None = Field(None, min_length=1, max_length=255)
    webhook_url: HttpUrl | None = Field(None, description="POSTed a signed event when the job ends")

    @field_validator("priority")
    @classmethod
    def _known_priority(cls, value: str) -> str:
        Priority.parse(value)  # raises ValueError with the list of choices
        return value.lower()

    def spec(self, request: dict[str, Any], kind: JobKind) -> JobSpec:
        if self.keep_alive is not None:
            request = request | {"keep_alive": self.keep_alive}
        if self.webhook_url is not None:
            request = request | {"webhook_url": str(self.webhook_url)}
        return JobSpec(
            kind=kind,
            model=self.model,
            priority=Priority.parse(self.priority).value,
            request=request,
            idempotency_key=self.idempotency_key,
        )


class GenerateJobCreate(JobBase):
    kind: Literal["generate"]
    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    max_tokens: int = Field(256, ge=1, le=MAX_CONTEXT_TOKENS)
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateJobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` (text) or `messages` (chat)")
        if self.messages is not None and not any(m.content for m in self.messages):
            raise ValueError("`messages` are all empty: at least one needs content")
        return self

    def to_spec(self) -> JobSpec:
        request: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop,
        }
        if self.prompt is not None:
            request["prompt"] = self.prompt
        else:
            request["messages"] = [m.model_dump() for m in self.messages or []]
        return self.spec(request, JobKind.GENERATE)


class EmbedJobCreate(JobBase):
    kind: Literal["embed"]
    input: str | list[str] = Field(description="one text, or a list of texts")

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise ValueError("`input` is an empty list: give at least one text")
        if len(texts) > MAX_EMBED_INPUTS:
            raise ValueError(f"`input` has {len(texts)} texts; at most {MAX_EMBED_INPUTS} per job")
        for i, text in enumerate(texts):
            if not text:
                raise ValueError(f"`input[{i}]` is empty")
        return value

    def to_spec(self) -> JobSpec:
        texts = [self.input] if isinstance(self.input, str) else self.input
        return self.spec({"input": texts}, JobKind.EMBED)


class NoopJobCreate(JobBase):
    """Goes through the whole dispatch path without a model call (probes, benchmarks)."""

    kind: Literal["noop"]

    def to_spec(self) -> JobSpec:
        return self.spec({}, JobKind.NOOP)


JobCreate = Annotated[GenerateJobCreate | EmbedJobCreate | NoopJobCreate, Field(discriminator="kind")]


class JobsCreate(Strict):
    jobs: list[JobCreate] = Field(min_length=1)


class JobSummary(BaseModel):
    id: str
    kind: str
    model: str
    priority: str
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    queue_wait_ms: int | None
    load_ms: int | None
    run_ms: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    worker: str | None
    device: str | None
    attempts: int
    error: str | None
    cancel_requested: bool
    idempotency_key: str | None

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        return cls(**_job_fields(job))


class JobPublic(JobSummary):
    request: dict[str, Any]
    result: dict[str, Any] | None

    @classmethod
    def of(cls, job: Job) -> JobPublic:
        return cls(**_job_fields(job), request=job.request, result=job.result)


def _job_fields(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "model": job.model,
        "priority": Priority(job.priority).label,
        "status": job.status,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "queue_wait_ms": job.queue_wait_ms,
        "load_ms": job.load_ms,
        "run_ms": job.run_ms,
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.completion_tokens,
        "worker": job.worker,
        "device": job.device,
        "attempts": job.attempts or 0,
        "error": job.error,
        "cancel_requested": job.cancel_requested_at is not None,
        "idempotency_key": job.idempotency_key,
    }


class JobsPublic(BaseModel):
    data: list[JobSummary]
    has_more: bool
    next_after: str | None = Field(None, description="pass as `after` for the next page")


class JobsAccepted(BaseModel):
    data: list[JobPublic]


class ModelCreate(Strict):
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, description="GGUF file, relative to (or inside) the models directory")
    kinds: list[ModelKind] = Field(default_factory=lambda: [ModelKind.GENERATE], min_length=1)
    context_length: int | None = Field(None, ge=1, le=MAX_CONTEXT_TOKENS)
    vram_mib: int | None = Field(
        None, ge=1, description="measured GPU memory the model needs; overrides gpuq's estimate for placement"
    )


class ModelPublic(BaseModel):
    """OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``) plus gpuq's fields."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gpuq"
    path: str
    kinds: list[str]
    context_length: int
    context_length_trained: int
    size_bytes: int
    architecture: str
    vram_estimate_mib: int
    vram_override_mib: int | None
    vram_mib: int = Field(description="what placement uses: the override if set, else the estimate")

    @classmethod
    def of(cls, model: Model) -> ModelPublic:
        return cls(
            id=model.name,
            created=int(model.created_at.timestamp()),
            path=model.path,
            kinds=model.kinds,
            context_length=model.context_length,
            context_length_trained=model.context_length_trained,
            size_bytes=model.size_bytes,
            architecture=model.architecture,
            vram_estimate_mib=model.vram_estimate_mib,
            vram_override_mib=model.vram_override_mib,
            vram_mib=model.vram_mib,
        )


class ModelsPublic(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelPublic]


class ErrorBody(BaseModel):
    detail: str


class RuleCreate(Strict):
    model_pattern: str = Field(min_length=1, max_length=128, description="glob over model names, e.g. llama-*")
    kind: Literal["generate", "embed"] | None = None
    effect: Literal["allow", "deny"]
    precedence: int = Field(0, ge=-1000, le=1000, description="higher is considered first")
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(None, min_length=1)
    gpu_uuids: list[Annotated[str, Field(pattern=r"^GPU-[A-Za-z0-9-]+$")]] | None = Field(None, min_length=1)
    gpu_name_pattern: str | None = Field(None, min_length=1, max_length=255)
    host_pattern: str | None = Field(None, min_length=1, max_length=255)
    min_memory_mib: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _valid_patterns(self) -> RuleCreate:
        globs = [p for p in (self.gpu_name_pattern, self.host_pattern) if p is not None]
        problems = [model_pattern_problem(self.model_pattern), *(glob_problem(p) for p in globs)]
        problem = next((p for p in problems if p), None)
        if problem is not None:
            raise ValueError(problem)
        return self


class RulePublic(RuleCreate):
    id: int
    created_at: datetime

    @classmethod
    def of(cls, rule: AffinityRule) -> RulePublic:
        return cls.model_validate(rule, from_attributes=True)


class RuleSaved(BaseModel):
    rule: RulePublic
    warnings: list[str]


class RulesPublic(BaseModel):
    data: list[RulePublic]


class GpuPublic(BaseModel):
    uuid: str
    host: str
    index: int
    name: str
    simulated: bool
    memory_total_mib: int
    memory_free_mib: int | None
    utilisation_pct: int | None
    temperature_c: int | None
    power_w: float | None
    healthy: bool
    unhealthy_reason: str | None
    last_seen: datetime
    live: bool = Field(description="a supervisor published telemetry for it in the last 30 s")


class GpusPublic(BaseModel):
    data: list[GpuPublic]


class PreviewGpu(BaseModel):
    uuid: str
    host: str
    index: int
    name: str
    allowed: bool
    fits: bool
    may_run: bool
    reasons: list[str]


class PlacementPreview(BaseModel):
    model: str
    kind: str
    vram_mib: int
    gpus: list[PreviewGpu]
    summary: str


def _ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


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


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the openai client may add fields gpuq does not use

    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)
    priority: str = Field("low", description="gpuq extension: batches default below interactive jobs")
    webhook_url: HttpUrl | None = Field(None, description="gpuq extension: POSTed a signed event when it ends")

    @field_validator("priority")
    @classmethod
    def _known_priority(cls, value: str) -> str:
        Priority.parse(value)
        return value.lower()


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


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

    @classmethod
    def of(cls, batch: Batch, counts: dict[str, int]) -> BatchObject:
        return cls(
            id=batch.id,
            endpoint=batch.endpoint,
            input_file_id=batch.input_file_id,
            completion_window=batch.completion_window,
            status=batch.status,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            created_at=int(batch.created_at.timestamp()),
            in_progress_at=_ts(batch.in_progress_at),
            expires_at=_ts(batch.expires_at),
            finalizing_at=_ts(batch.finalizing_at),
            completed_at=_ts(batch.completed_at),
            failed_at=_ts(batch.failed_at),
            expired_at=_ts(batch.expired_at),
            cancelling_at=_ts(batch.cancelling_at),
            cancelled_at=_ts(batch.cancelled_at),
            request_counts=RequestCounts(**counts),
            metadata=batch.batch_metadata,
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

    @classmethod
    def of(cls, batch: Batch, by_status: dict[str, int]) -> BatchProgress:
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
        )


class ScheduleCreate(Strict):
    name: str = Field(min_length=1, max_length=128)
    cron: str = Field(min_length=1, max_length=128, description="five-field cron, e.g. '0 2 * * *'")
    timezone: str = Field("UTC", description="IANA name the cron is read in, e.g. Europe/Paris")
    input_file_id: str | None = Field(None, description="a stored batch file to run...")
    requests: list[dict[str, Any]] | None = Field(None, min_length=1, description="...or inline batch lines")
    endpoint: str = "/v1/chat/completions"
    priority: str = "low"
    enabled: bool = True
    misfire: Literal["skip", "run_once"] = "skip"

    @model_validator(mode="after")
    def _one_input(self) -> ScheduleCreate:
        if (self.input_file_id is None) == (self.requests is None):
            raise ValueError("give exactly one of `input_file_id` (a stored batch file) or `requests` (inline lines)")
        Priority.parse(self.priority)
        return self


class SchedulePatch(Strict):
    enabled: bool | None = None
    cron: str | None = Field(None, min_length=1, max_length=128)
    timezone: str | None = None
    misfire: Literal["skip", "run_once"] | None = None
    priority: str | None = None


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
    next_fire_at: datetime
    last_fired_at: datetime | None
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
            next_fire_at=schedule.next_fire_at,
            last_fired_at=schedule.last_fired_at,
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


class DeliveryPublic(BaseModel):
    id: str
    event: str
    url: str
    job_id: str | None
    batch_id: str | None
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> DeliveryPublic:
        return cls.model_validate(delivery, from_attributes=True)


class DeliveriesPublic(BaseModel):
    data: list[DeliveryPublic]
