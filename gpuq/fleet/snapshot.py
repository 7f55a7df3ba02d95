"""A snapshot of the fleet from SQL, in the plain types placement works on."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import AffinityRule, Gpu
from gpuq.fleet.affinity import GpuTarget, Rule
from gpuq.fleet.placement import Candidate


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


@dataclass(frozen=True, slots=True)
class Fleet:
    rules: list[Rule]
    gpus: list[Candidate]


def load_fleet(session: Session) -> Fleet:
    """Rules and GPUs as SQL has them. Free memory is the total here: the API asks what
    can ever run; live free memory comes from workers' telemetry."""
    return Fleet(
        rules=[rule_of(r) for r in store.list_rules(session)],
        gpus=[Candidate(target_of(g), g.memory_total_mib, g.healthy) for g in store.list_gpus(session)],
    )
