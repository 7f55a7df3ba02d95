"""The model registry's shapes (the list is OpenAI's model list)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import BaseModel, Field

from api.schemas.common import MAX_CONTEXT_TOKENS, MAX_SQL_INT, Strict
from gpuq.db.tables import Model, ModelAlias, ModelKind


class ModelCreate(Strict):
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, description="GGUF file, relative to (or inside) the models directory")
    kinds: list[ModelKind] = Field(default_factory=lambda: [ModelKind.GENERATE], min_length=1)
    context_length: int | None = Field(None, ge=1, le=MAX_CONTEXT_TOKENS)
    vram_mib: int | None = Field(
        None,
        ge=1,
        le=MAX_SQL_INT,
        description="measured GPU memory the model needs; overrides gpuq's estimate for placement",
    )


class ModelPublic(BaseModel):
    """OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``) plus gpuq's fields."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gpuq"
    path: str = Field(
        description="the GGUF file: its path on the server for admin keys, its file name alone for others"
    )
    kinds: list[str]
    context_length: int
    context_length_trained: int
    size_bytes: int
    architecture: str
    vram_estimate_mib: int
    vram_override_mib: int | None
    vram_mib: int = Field(description="what placement uses: the override if set, else the estimate")
    alias_of: str | None = Field(
        None, description="for an alias: the registered model its jobs run as (the other fields are that model's)"
    )

    @classmethod
    def of(cls, model: Model, *, full_path: bool = True, alias: ModelAlias | None = None) -> ModelPublic:
        """``full_path=False`` for callers who are not admins: where files live on the
        server is the operators' business (and a map for an attacker)."""
        return cls(
            id=model.name if alias is None else alias.alias,
            alias_of=None if alias is None else model.name,
            created=int((model if alias is None else alias).created_at.timestamp()),
            path=model.path if full_path else PurePath(model.path).name,
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


class ModelAliasSet(Strict):
    model: str = Field(min_length=1, max_length=128, description="the registered model the alias names")


class ModelAliasPublic(BaseModel):
    alias: str
    model: str = Field(description="the registered model its jobs run as")
    created: int


class ModelAliasesPublic(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelAliasPublic]
