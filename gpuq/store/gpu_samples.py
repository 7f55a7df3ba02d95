"""GPU telemetry history: one row per GPU per sample, written by supervisors, kept for a while."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from gpuq.db.tables import GpuSample
from gpuq.store._sql import rows_changed


class GpuReading(Protocol):
    """What a sample records of a GPU (``gpuq.fleet.gpus.GpuInfo`` is one)."""

    @property
    def uuid(self) -> str: ...
    @property
    def memory_total_mib(self) -> int: ...
    @property
    def memory_free_mib(self) -> int: ...
    @property
    def utilisation_pct(self) -> int | None: ...
    @property
    def temperature_c(self) -> int | None: ...
    @property
    def power_w(self) -> float | None: ...


def record_gpu_samples(session: Session, host: str, gpus: Sequence[GpuReading], *, at: datetime) -> int:
    """One row per GPU, in one statement. A reading the GPU does not give (anything but memory,
    on a simulated GPU) is stored as NULL, never as a made-up number."""
    rows = [
        {
            "gpu_uuid": g.uuid,
            "host": host,
            "sampled_at": at,
            "utilization_pct": g.utilisation_pct,
            "memory_used_mib": max(0, g.memory_total_mib - g.memory_free_mib),
            "memory_total_mib": g.memory_total_mib,
            "temperature_c": g.temperature_c,
            "power_w": g.power_w,
        }
        for g in gpus
    ]
    if rows:
        session.execute(insert(GpuSample), rows)
    session.commit()
    return len(rows)


def prune_gpu_samples(session: Session, *, before: datetime) -> int:
    """Delete samples older than ``before`` (any host's: a host that left the fleet ages out too)."""
    deleted = rows_changed(session, delete(GpuSample).where(GpuSample.sampled_at < before))
    session.commit()
    return deleted


def gpu_samples(session: Session, *, gpu_uuid: str | None = None, since: datetime | None = None) -> list[GpuSample]:
    """Samples oldest first, optionally of one GPU and from ``since`` on (for charts)."""
    query = select(GpuSample)
    if gpu_uuid is not None:
        query = query.where(GpuSample.gpu_uuid == gpu_uuid)
    if since is not None:
        query = query.where(GpuSample.sampled_at >= since)
    return list(session.scalars(query.order_by(GpuSample.sampled_at, GpuSample.id)))
