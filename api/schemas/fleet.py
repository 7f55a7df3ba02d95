"""GPUs, affinity rules and the placement preview."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from api.schemas.common import MAX_SQL_INT, Strict
from gpuq.db.tables import AffinityRule
from gpuq.fleet.affinity import glob_problem, model_pattern_problem


class RuleCreate(Strict):
    model_pattern: str = Field(min_length=1, max_length=128, description="glob over model names, e.g. llama-*")
    kind: Literal["generate", "embed"] | None = None
    effect: Literal["allow", "deny"]
    precedence: int = Field(0, ge=-1000, le=1000, description="higher is considered first")
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(None, min_length=1)
    gpu_uuids: list[Annotated[str, Field(pattern=r"^(GPU|MIG)-[A-Za-z0-9-]+$")]] | None = Field(None, min_length=1)
    gpu_name_pattern: str | None = Field(None, min_length=1, max_length=255)
    host_pattern: str | None = Field(None, min_length=1, max_length=255)
    min_memory_mib: int | None = Field(None, ge=1, le=MAX_SQL_INT)

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
    too_small_for: list[str] = Field(
        description="models a load on it alone ran out of memory for; "
        "kept off it until the mark expires or it is cleared"
    )
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
    vram_mib: int = Field(description="what placement uses: the admin's measured figure if set, else the estimate")
    vram_slots: int = Field(
        description="K: sequences per generation context on a GPU worker (GPUQ_WORKER_SLOTS), counted in the estimate"
    )
    vram_basis: str = Field(description="what vram_mib counts, in words")
    gpus: list[PreviewGpu]
    summary: str
