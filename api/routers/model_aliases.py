"""/v1/model-aliases: names a client insists on (`text-embedding-3-small`, `gpt-4o-mini`)
mapped by an admin to registered models. Jobs sent under an alias run as the model's own."""

from __future__ import annotations

import re

from fastapi import APIRouter, Response, status

from api.deps import ADMIN_ONLY, KEY_REQUIRED, CallerDep, SessionDep
from api.errors import errors
from api.schemas import ModelAliasesPublic, ModelAliasPublic, ModelAliasSet
from gpuq import store
from gpuq.db.tables import ModelAlias
from gpuq.errors import RequestError

# Any name a client may send (`llama3.2:latest`, `gpt-4o-mini`): aliases never become queue
# names, so they need not keep to a model name's alphabet. A path segment, so no "/".
_ALIAS = re.compile(r"[^\s/]{1,128}")

router = APIRouter(prefix="/v1/model-aliases", tags=["models"], dependencies=KEY_REQUIRED)


def _public(alias: ModelAlias) -> ModelAliasPublic:
    return ModelAliasPublic(alias=alias.alias, model=alias.model, created=int(alias.created_at.timestamp()))


@router.get("", response_model=ModelAliasesPublic)
async def list_aliases(db: SessionDep, caller: CallerDep) -> ModelAliasesPublic:
    return ModelAliasesPublic(data=[_public(a) for a in await db.run_sync(store.list_aliases)])


@router.put("/{alias}", response_model=ModelAliasPublic, dependencies=ADMIN_ONLY, responses=errors(403, 404, 409))
async def set_alias(alias: str, body: ModelAliasSet, db: SessionDep) -> ModelAliasPublic:
    """Point ``alias`` at a registered model (a new alias, or one moved to another model)."""
    if not _ALIAS.fullmatch(alias):
        raise RequestError(422, f"alias {alias!r} is invalid: at most 128 characters, no spaces", param="alias")
    if await db.run_sync(store.get_model, alias) is not None:
        raise RequestError(409, f"{alias!r} is a registered model's own name; an alias must be another name")
    if await db.run_sync(store.get_model, body.model) is None:
        raise RequestError(
            404, f"model {body.model!r} is not registered (an alias names a registered model, not another alias)"
        )
    return _public(await db.run_sync(store.save_alias, alias, body.model))


@router.delete("/{alias}", status_code=status.HTTP_204_NO_CONTENT, dependencies=ADMIN_ONLY, responses=errors(403, 404))
async def delete_alias(alias: str, db: SessionDep) -> Response:
    if not await db.run_sync(store.delete_alias, alias):
        raise RequestError(404, f"no alias {alias!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
