"""Jobs: what users submit and what they read back."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, HttpUrl, field_validator, model_validator

from api.schemas.common import PriorityName, Strict
from gpuq.batches.destinations import redact_url
from gpuq.batches.openai_format import tool_fields
from gpuq.db.tables import Job, JobKind, JobRun, utcnow
from gpuq.errors import RequestError
from gpuq.jobs import tool_calls
from gpuq.jobs.constraint import enforceable
from gpuq.jobs.generation_params import GenerationParams, generation
from gpuq.jobs.request import (
    MAX_EMBED_INPUTS,
    MAX_STOP_SEQUENCES,
    ChatMessage,
    JobParams,
    KeepAlive,
    MaxTokens,
    Penalty,
    Probability,
    RepeatPenalty,
    Seed,
    Stop,
    Temperature,
    TopK,
    embedding,
)
from gpuq.jobs.snippet import snippet
from gpuq.jobs.submit import JobSpec
from gpuq.queue_names import Priority

_DEFAULTS = GenerationParams(prompt="-")  # the jobs API's sampling defaults: llama.cpp's


class JobBase(Strict):
    model: str = Field(min_length=1, max_length=128)
    keep_alive: KeepAlive | None = None
    priority: PriorityName = Field("normal", validate_default=True, description="high, normal or low")
    idempotency_key: str | None = Field(None, min_length=1, max_length=255)
    webhook_url: HttpUrl | None = Field(None, description="POSTed a signed event when the job ends")
    deadline: datetime | None = Field(
        None,
        description="when the job is needed by (ISO 8601 with a time zone): within its priority, its tenant's jobs "
        "with a deadline run first, earliest first; a job the fleet cannot finish by then at its recent pace is "
        "refused (429 with Retry-After) and nothing is queued",
    )

    @field_validator("deadline")
    @classmethod
    def _deadline_ahead(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("give the deadline a time zone, e.g. 2026-01-31T12:00:00Z")
        if value <= utcnow():
            raise ValueError(f"the deadline {value.isoformat()} has passed: give a time in the future")
        return value

    def common(self) -> dict[str, Any]:
        """The fields every kind of job's request carries."""
        return {"keep_alive": self.keep_alive, "webhook_url": str(self.webhook_url) if self.webhook_url else None}

    def spec(self, request: JobParams, kind: JobKind) -> JobSpec:
        return JobSpec(
            kind=kind,
            model=self.model,
            priority=self.priority,
            params=request,
            idempotency_key=self.idempotency_key,
            deadline=self.deadline,
        )


class GenerateJobCreate(JobBase):
    """A generation; sampling defaults are llama.cpp's (gpuq/jobs/request.py says why)."""

    kind: Literal["generate"]
    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt_token_ids: list[int] | None = Field(
        None, min_length=1, description="the prompt as token ids, run as given (no BOS added)"
    )
    max_tokens: MaxTokens = 256
    temperature: Temperature = _DEFAULTS.temperature
    top_p: Probability = _DEFAULTS.top_p
    top_k: TopK = _DEFAULTS.top_k
    min_p: Probability = _DEFAULTS.min_p
    repeat_penalty: RepeatPenalty = _DEFAULTS.repeat_penalty
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    seed: Seed | None = None
    stop: list[Stop] = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)
    n: int = Field(1, description="samples of the one prompt (evaluated once), 1 to 128: result.choices")
    logprobs: int | None = Field(
        None, description="0 to 20: each token's log-probability and this many alternatives (result.logprobs)"
    )
    echo: bool = Field(False, description="with logprobs: the prompt's tokens' too (result.prompt_logprobs)")
    json_schema: dict[str, Any] | None = Field(
        None, description='structured output: the text is JSON valid against this schema ({"type": "object"}: any)'
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="functions the chat template offers the model (OpenAI's tools); needs `messages`"
    )
    tool_choice: Literal["auto", "required"] | dict[str, Any] | None = Field(
        None, description='auto (default), required, or {"type": "function", "function": {"name": ...}}: enforced'
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateJobCreate:
        if sum(x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)) != 1:
            raise ValueError("give exactly one of `prompt` (text), `messages` (chat) or `prompt_token_ids`")
        if self.messages is not None and not any(m.content or m.tool_calls for m in self.messages):
            raise ValueError("`messages` are all empty: at least one needs content")
        return self

    def to_spec(self) -> JobSpec:
        try:  # fail closed: refused naming the keyword, before any job exists (422, as this API's bad values)
            if self.json_schema is not None:
                enforceable(self.json_schema, "json_schema")
            if self.tools is not None:
                tool_fields(self.tools, self.tool_choice)
        except RequestError as exc:
            raise RequestError(422, exc.message, param=exc.param, code=exc.code) from None
        fields = self.model_dump(include=set(GenerationParams.model_fields) - set(JobParams.model_fields))
        return self.spec(generation(422, **fields, **self.common()), JobKind.GENERATE)


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
        return self.spec(embedding(422, input=texts, **self.common()), JobKind.EMBED)


class NoopJobCreate(JobBase):
    """Goes through the whole dispatch path without a model call (probes, benchmarks)."""

    kind: Literal["noop"]

    def to_spec(self) -> JobSpec:
        return self.spec(JobParams.model_validate(self.common()), JobKind.NOOP)


JobCreate = Annotated[GenerateJobCreate | EmbedJobCreate | NoopJobCreate, Field(discriminator="kind")]


class JobsCreate(Strict):
    jobs: list[JobCreate] = Field(min_length=1)


class JobSummary(BaseModel):
    id: str
    kind: str
    model: str
    snippet: str = Field(
        description="what it is, in a few words: its batch line's custom_id, else the start of its prompt, last "
        "message or first input (80 characters at most)"
    )
    priority: str
    status: str
    created_at: datetime
    deadline: datetime | None = Field(None, description="when it is needed by, as submitted (a batch's: its expiry)")
    started_at: datetime | None
    finished_at: datetime | None
    queue_wait_ms: int | None
    load_ms: int | None
    run_ms: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    tokens_so_far: int | None = Field(
        None,
        description="a running job's completion tokens so far, from its token stream (jobs of streaming calls); "
        "null otherwise (a finished job has completion_tokens)",
    )
    cached_tokens: int | None = Field(
        None,
        description="of the prompt's tokens, those whose KV the worker reused instead of evaluating them: "
        "from one of its KV slots, or restored from its prefix cache (below)",
    )
    cached_ram_tokens: int | None = Field(
        None, description="of cached_tokens, those restored from the worker's prefix cache in host RAM"
    )
    cached_disk_tokens: int | None = Field(
        None, description="of cached_tokens, those restored from the worker's prefix cache on disk"
    )
    parked_ms: int | None = Field(
        None,
        description="milliseconds the job's generation waited parked (its KV in host memory, its slot given to a "
        "more urgent job) before it resumed where it stopped; 0 when it never was",
    )
    worker: str | None
    device: str | None
    attempts: int
    error: str | None
    cancel_requested: bool
    idempotency_key: str | None
    owner: str | None
    host: str | None
    gpu_uuid: str | None
    batch_id: str | None
    gpu_seconds: float | None = Field(description="GPU time measured through NVML; null on CPU or simulated GPUs")
    energy_j: float | None = Field(description="energy drawn by its GPU while it ran; null where not measured")
    energy_share: float | None = Field(
        description="the part of its GPU's energy and GPU time charged to it, by its share of the tokens the GPU "
        "decoded while it ran (1.0 alone; less when other jobs were decoded beside it); null where not measured"
    )

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        return cls(**_job_fields(job))

    @classmethod
    def listed(cls, job: Job, tokens_so_far: int | None) -> JobSummary:
        """As a list shows it: a running job with its tokens so far."""
        return cls(**_job_fields(job), tokens_so_far=tokens_so_far)


class JobRunPublic(BaseModel):
    """One run of a job: a worker's claim of it, and how that run ended."""

    attempt: int = Field(description="the job's attempt count as this run's claim made it")
    worker: str
    host: str | None
    device: str | None
    started_at: datetime
    ended_at: datetime | None = Field(description="null while it runs")
    outcome: str | None = Field(
        description="succeeded, failed, cancelled, or requeued (its worker died, handed it back, or an admin "
        "requeued it); null while it runs"
    )
    reason: str | None = Field(description="the error, or why the run went back to the queue")
    refunded: bool = Field(
        description="its attempt was not charged to the job (it died beside others, or was sent back uncharged)"
    )

    @classmethod
    def of(cls, run: JobRun) -> JobRunPublic:
        return cls(
            attempt=run.attempt,
            worker=run.worker,
            host=run.host,
            device=run.device,
            started_at=run.started_at,
            ended_at=run.ended_at,
            outcome=run.outcome,
            reason=run.reason,
            refunded=run.refunded,
        )


class JobPublic(JobSummary):
    request: dict[str, Any]
    result: dict[str, Any] | None
    runs: list[JobRunPublic] | None = Field(
        None,
        description="every run of the job, oldest first, a rerun included (GET /v1/jobs/{id}; null in other answers)",
    )

    @classmethod
    def of(cls, job: Job, runs: Sequence[JobRun] | None = None) -> JobPublic:
        result = tool_calls.with_calls(job.request, job.result)
        shown_runs = [JobRunPublic.of(run) for run in runs] if runs is not None else None
        return cls(**_job_fields(job), request=_shown_request(job.request), result=result, runs=shown_runs)


def _shown_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request as stored, but a webhook URL's credentials hidden (they are sent, never shown)."""
    url = request.get("webhook_url")
    return request | {"webhook_url": redact_url(url)} if isinstance(url, str) else request


def _job_fields(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "model": job.model,
        "snippet": snippet(job.request, job.custom_id),
        "priority": Priority(job.priority).label,
        "status": job.status,
        "created_at": job.created_at,
        "deadline": job.deadline,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "queue_wait_ms": job.queue_wait_ms,
        "load_ms": job.load_ms,
        "run_ms": job.run_ms,
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.completion_tokens,
        "cached_tokens": job.cached_tokens,
        "cached_ram_tokens": job.cached_ram_tokens,
        "cached_disk_tokens": job.cached_disk_tokens,
        "parked_ms": job.parked_ms,
        "worker": job.worker,
        "device": job.device,
        "attempts": job.attempts or 0,
        "error": job.error,
        "cancel_requested": job.cancel_requested_at is not None,
        "idempotency_key": job.idempotency_key,
        "owner": job.owner,
        "host": job.host,
        "gpu_uuid": job.gpu_uuid,
        "batch_id": job.batch_id,
        "gpu_seconds": job.gpu_seconds,
        "energy_j": job.energy_j,
        "energy_share": job.energy_share,
    }


class JobsPublic(BaseModel):
    data: list[JobSummary]
    has_more: bool
    next_after: str | None = Field(None, description="pass as `after` for the next page")


class JobsAccepted(BaseModel):
    data: list[JobPublic]
