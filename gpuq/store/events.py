"""Worker and GPU events: a worker started, stopped, crashed, restarted, drained; a GPU
marked unhealthy or cleared. Written where each happens, read by ``GET /v1/events`` and the
dashboard's workers and GPUs pages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, func, insert, literal, select, tuple_
from sqlalchemy.orm import Session

from gpuq.db.tables import EventKind, Gpu, WorkerEvent, utcnow


@dataclass(frozen=True, slots=True)
class NewEvent:
    kind: EventKind
    host: str | None = None
    slot: str | None = None
    worker: str | None = None  # a worker's name, or its name up to the pid (host.slot.pid)
    gpu_uuids: tuple[str, ...] = ()
    exit_status: int | None = None
    detail: str | None = None
    at: datetime = field(default_factory=utcnow)  # when it happened, which may be before it is written


def worker_identity(name: str) -> str:
    """A worker's name without its random suffix (host.slot.pid.xxxx -> host.slot.pid): what
    its supervisor knows of it, and what events record."""
    return name.rsplit(".", 1)[0]


def record_events(session: Session, events: Sequence[NewEvent]) -> None:
    rows = [
        {
            "at": e.at,
            "kind": e.kind.value,
            "host": e.host,
            "slot": e.slot,
            "worker": e.worker,
            "gpu_uuids": ",".join(e.gpu_uuids),
            "exit_status": e.exit_status,
            "detail": e.detail[:2000] if e.detail else e.detail,
        }
        for e in events
    ]
    if rows:
        session.execute(insert(WorkerEvent), rows)
    session.commit()


def record_gpu_events(session: Session, kind: EventKind, gpu_uuids: Sequence[str], detail: str | None) -> None:
    """One event per GPU, each with the host the inventory has it on."""
    hosts = {uuid: host for uuid, host in session.execute(select(Gpu.uuid, Gpu.host).where(Gpu.uuid.in_(gpu_uuids)))}
    record_events(session, [NewEvent(kind, host=hosts.get(u), gpu_uuids=(u,), detail=detail) for u in gpu_uuids])


@dataclass(frozen=True, slots=True)
class EventFilter:
    kinds: tuple[str, ...] = ()
    host: str | None = None
    slot: str | None = None
    worker: str | None = None  # a worker's full name, or its name up to the pid
    gpu_uuid: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _conditions(flt: EventFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if flt.kinds:
        conditions.append(WorkerEvent.kind.in_(flt.kinds))
    if flt.host is not None:
        conditions.append(WorkerEvent.host == flt.host)
    if flt.slot is not None:
        conditions.append(WorkerEvent.slot == flt.slot)
    if flt.worker is not None:
        conditions.append(WorkerEvent.worker.in_({flt.worker, worker_identity(flt.worker)}))
    if flt.gpu_uuid is not None:
        # The GPUs are a comma-separated list: a group slot's events name each of its GPUs.
        listed = literal(",") + WorkerEvent.gpu_uuids + literal(",")
        conditions.append(listed.contains(f",{flt.gpu_uuid},", autoescape=True))
    if flt.since is not None:
        conditions.append(WorkerEvent.at >= flt.since)
    if flt.until is not None:
        conditions.append(WorkerEvent.at < flt.until)
    return conditions


def list_events(
    session: Session, flt: EventFilter, *, limit: int, after: int | None = None
) -> tuple[list[WorkerEvent], bool]:
    """Newest first, keyset-paginated: ``after`` is the last id of the previous page (a
    LookupError if there is no such event). Returns the page and whether more follow."""
    query = select(WorkerEvent).where(*_conditions(flt))
    if after is not None:
        anchor = session.get(WorkerEvent, after)
        if anchor is None:
            raise LookupError(after)
        query = query.where(tuple_(WorkerEvent.at, WorkerEvent.id) < tuple_(anchor.at, anchor.id))
    query = query.order_by(WorkerEvent.at.desc(), WorkerEvent.id.desc()).limit(limit + 1)
    rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def restarts_by_slot(session: Session, *, since: datetime | None = None) -> dict[tuple[str, str], int]:
    """Restarts per (host, slot) in the events kept, or since a moment."""
    query = select(WorkerEvent.host, WorkerEvent.slot, func.count()).where(WorkerEvent.kind == EventKind.RESTARTED)
    if since is not None:
        query = query.where(WorkerEvent.at >= since)
    rows = session.execute(query.group_by(WorkerEvent.host, WorkerEvent.slot))
    return {(host, slot): n for host, slot, n in rows if host is not None and slot is not None}
