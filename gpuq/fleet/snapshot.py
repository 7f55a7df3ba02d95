"""A snapshot of the fleet from SQL, in the plain types placement works on."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import AffinityRule, Gpu, Model
from gpuq.fleet.affinity import GpuTarget, Rule
from gpuq.fleet.placement import Candidate, PlacementRequest


def rule_of(row: AffinityRule) -> Rule:
    return Rule(
        id=row.id,
        model_pattern=row.model_pattern,
        kind=row.kind,
        effect=row.effect,
        precedence=row.precedence,
        gpu_indices=tuple(row.gpu_indices) if row.gpu_indices is not None else None,
        gpu_uuids=tuple(row.gpu_uuids) if row.gpu_uuids is not None else None,
        gpu_name_pattern=row.gpu_name_pattern,
        host_pattern=row.host_pattern,
        min_memory_mib=row.min_memory_mib,
    )


def target_of(row: Gpu) -> GpuTarget:
    return GpuTarget(row.uuid, row.index, row.name, row.host, row.memory_total_mib)


def request_of(model: Model, kind: str, basis: str = "") -> PlacementRequest:
    """What placement needs to know of a registered model for one kind of job."""
    return PlacementRequest(model.name, kind, model.vram_mib, basis, per_gpu_mib=model.vram_per_gpu_mib)


@dataclass(frozen=True, slots=True)
class Fleet:
    rules: list[Rule]
    gpus: list[Candidate]


def load_fleet(session: Session, *, free_mib: dict[str, int] | None = None) -> Fleet:
    """Rules and GPUs as SQL has them, with each GPU's free memory where the caller has a
    live reading (``free_mib`` by UUID, from telemetry) and unknown (None) otherwise: what can
    ever run is decided on total memory, what fits now only on a reading."""
    free_mib = free_mib or {}
    return Fleet(
        rules=[rule_of(r) for r in store.list_rules(session)],
        gpus=[Candidate(target_of(g), free_mib.get(g.uuid), g.healthy) for g in store.list_gpus(session)],
    )
