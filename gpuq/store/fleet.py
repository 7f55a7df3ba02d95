"""The GPU inventory and the affinity rules."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    AffinityRule,
    Gpu,
    utcnow,
)
from gpuq.store._sql import NO_SYNC, commit_changed

# ---------------------------------------------------------------- GPU inventory


def upsert_gpus(session: Session, gpus: Sequence[Gpu]) -> None:
    """Record what a supervisor discovered; keeps health flags admins or workers set."""
    now = utcnow()
    for gpu in gpus:
        existing = session.get(Gpu, gpu.uuid)
        if existing is None:
            gpu.first_seen = gpu.last_seen = now
            session.add(gpu)
        else:
            existing.host, existing.index, existing.name = gpu.host, gpu.index, gpu.name
            existing.memory_total_mib, existing.simulated, existing.last_seen = gpu.memory_total_mib, gpu.simulated, now
    session.commit()


def list_gpus(session: Session) -> Sequence[Gpu]:
    return session.scalars(select(Gpu).order_by(Gpu.host, Gpu.index)).all()


def set_gpu_health(session: Session, uuid: str, *, healthy: bool, reason: str | None) -> bool:
    statement = (
        update(Gpu)
        .execution_options(**NO_SYNC)
        .where(Gpu.uuid == uuid)
        .values(healthy=healthy, unhealthy_reason=reason)
    )
    return commit_changed(session, statement)


# ---------------------------------------------------------------- affinity rules


def list_rules(session: Session) -> Sequence[AffinityRule]:
    return session.scalars(select(AffinityRule).order_by(AffinityRule.precedence.desc(), AffinityRule.id)).all()


def get_rule(session: Session, rule_id: int) -> AffinityRule | None:
    return session.get(AffinityRule, rule_id)


def save_rule(session: Session, rule: AffinityRule) -> AffinityRule:
    merged = session.merge(rule)
    session.commit()
    return merged


def delete_rule(session: Session, rule_id: int) -> bool:
    return commit_changed(session, delete(AffinityRule).where(AffinityRule.id == rule_id))
