"""/v1/models: the model registry (list is OpenAI-compatible)."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, status

from api.deps import ADMIN_ONLY, KEY_REQUIRED, CallerDep, SessionDep, StateDep
from api.errors import errors
from api.schemas import ModelCreate, ModelPublic, ModelsPublic
from gpuq import store
from gpuq.db.tables import Model
from gpuq.errors import RequestError
from gpuq.registry.models import InvalidModel, build_model, resolve_model_path

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=KEY_REQUIRED)


@router.get("", response_model=ModelsPublic)
async def list_models(db: SessionDep, caller: CallerDep) -> ModelsPublic:
    """The registered models, then their aliases (each as its model, `alias_of` naming it)."""
    models = await db.run_sync(store.list_models)
    by_name = {m.name: m for m in models}
    aliases = [a for a in await db.run_sync(store.list_aliases) if a.model in by_name]
    return ModelsPublic(
        data=[ModelPublic.of(m, full_path=caller.is_admin) for m in models]
        + [ModelPublic.of(by_name[a.model], full_path=caller.is_admin, alias=a) for a in aliases]
    )


@router.get("/{name}", response_model=ModelPublic, responses=errors(404))
async def read_model(name: str, db: SessionDep, caller: CallerDep) -> ModelPublic:
    model = await db.run_sync(store.find_model, name)
    if model is None:
        raise RequestError(404, f"model {name!r} is not registered")
    alias = None if model.name == name else await db.run_sync(store.get_alias, name)
    return ModelPublic.of(model, full_path=caller.is_admin, alias=alias)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    dependencies=ADMIN_ONLY,
    responses=errors(403, 409),
)
async def register_model(body: ModelCreate, db: SessionDep, state: StateDep) -> ModelPublic:
    """Register (or re-register) a GGUF file under the models directory by name."""
    if await db.run_sync(store.get_alias, body.name) is not None:
        raise RequestError(409, f"{body.name!r} is an alias; delete it (DELETE /v1/model-aliases/{body.name}) first")

    def build() -> Model:
        path = resolve_model_path(state.settings.models_dir, body.path)
        return build_model(
            name=body.name,
            path=path,
            kinds=set(body.kinds),
            context_length=body.context_length,
            vram_override_mib=body.vram_mib,
            slots=state.settings.slots_for(on_gpu=True),  # K, as the workers read it from the same settings
        )

    try:
        model = await to_thread.run_sync(build)
    except InvalidModel as exc:
        raise RequestError(422, str(exc)) from None
    return ModelPublic.of(await db.run_sync(store.save_model, model))
