"""/v1/affinity-rules: where models may run; CRUD and a placement preview."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from fastapi import APIRouter, Response, status

from api.deps import ADMIN_ONLY, RowId, SessionDep, StateDep
from api.errors import errors
from api.schemas import PlacementPreview, PreviewGpu, RuleCreate, RulePublic, RuleSaved, RulesPublic
from gpuq import store
from gpuq.db.tables import AffinityRule, JobKind, Model
from gpuq.errors import RequestError
from gpuq.fleet.placement import PlacementRequest, placeable, preview
from gpuq.fleet.snapshot import Fleet, load_fleet, request_of, rule_of
from gpuq.registry.models import vram_basis

router = APIRouter(prefix="/v1/affinity-rules", tags=["affinity"], dependencies=ADMIN_ONLY, responses=errors(403))


@router.get("", response_model=RulesPublic)
async def list_rules(db: SessionDep) -> RulesPublic:
    return RulesPublic(data=[RulePublic.of(r) for r in await db.run_sync(store.list_rules)])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RuleSaved)
async def create_rule(body: RuleCreate, db: SessionDep) -> RuleSaved:
    """A rule that selects no known GPU, names no registered model, or leaves a model's kind of
    jobs no GPU to run on (they would be refused) is saved with a warning."""
    return await _save(db, AffinityRule(**body.model_dump()))


@router.put("/{rule_id}", response_model=RuleSaved, responses=errors(404))
async def replace_rule(rule_id: RowId, body: RuleCreate, db: SessionDep) -> RuleSaved:
    existing = await db.run_sync(store.get_rule, rule_id)
    if existing is None:
        raise RequestError(404, f"affinity rule {rule_id} does not exist")
    return await _save(db, AffinityRule(id=rule_id, created_at=existing.created_at, **body.model_dump()))


@router.delete("/{rule_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404))
async def delete_rule(rule_id: RowId, db: SessionDep) -> Response:
    if not await db.run_sync(store.delete_rule, rule_id):
        raise RequestError(404, f"affinity rule {rule_id} does not exist")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/preview", response_model=PlacementPreview, responses=errors(404))
async def preview_placement(
    model: str, db: SessionDep, state: StateDep, kind: JobKind = JobKind.GENERATE
) -> PlacementPreview:
    """Where may `model` run for `kind` jobs, and why: per GPU, the deciding rule and the memory check."""
    registered = await db.run_sync(store.get_model, model)
    if registered is None:
        raise RequestError(404, f"model {model!r} is not registered")
    fleet = await db.run_sync(load_fleet)
    slots = state.settings.slots_for(on_gpu=True)
    basis = vram_basis(registered, slots)
    request = PlacementRequest(model, kind.value, registered.vram_mib, basis)
    rows = preview(request, fleet.gpus, fleet.rules)
    gpus = [
        PreviewGpu(
            uuid=r.gpu.target.uuid,
            host=r.gpu.target.host,
            index=r.gpu.target.index,
            name=r.gpu.target.name,
            allowed=r.allowed,
            fits=r.fits,
            may_run=r.allowed and r.fits,
            reasons=r.reasons,
        )
        for r in rows
    ]
    able = [g for g in gpus if g.may_run]
    summary = (
        "no GPUs are registered: CPU workers run every model"
        if not gpus
        else f"{model} may run on {len(able)} of {len(gpus)} GPUs"
        + (": " + ", ".join(f"{g.host}/{g.index}" for g in able) if able else "")
    )
    return PlacementPreview(
        model=model,
        kind=kind.value,
        vram_mib=registered.vram_mib,
        vram_slots=slots,
        vram_basis=basis,
        gpus=gpus,
        summary=summary,
    )


async def _save(db: SessionDep, rule: AffinityRule) -> RuleSaved:
    saved = await db.run_sync(store.save_rule, rule)
    fleet = await db.run_sync(load_fleet)
    models = await db.run_sync(store.list_models)
    return RuleSaved(rule=RulePublic.of(saved), warnings=_warnings(saved, fleet, models))


def _warnings(row: AffinityRule, fleet: Fleet, models: Sequence[Model]) -> list[str]:
    rule = rule_of(row)
    warnings = []
    if fleet.gpus and not any(rule.selects(g.target) for g in fleet.gpus):
        warnings.append(f"the rule selects none of the {len(fleet.gpus)} known GPUs")
    matched = [m for m in models if fnmatchcase(m.name, rule.model_pattern)]
    if not matched:
        warnings.append(f"no registered model matches {rule.model_pattern!r}")
    for model in matched if fleet.gpus else []:
        for kind in model.kinds:
            if (row.kind is None or row.kind == kind) and not placeable(
                request_of(model, kind), fleet.gpus, fleet.rules
            ):
                warnings.append(
                    f"{model.name} now has no GPU it may run {kind} jobs on: they will be refused until a rule allows "
                    f"a GPU that holds it (GET /v1/affinity-rules/preview?model={model.name}&kind={kind} says why)"
                )
    return warnings
