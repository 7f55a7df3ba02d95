"""Queue names and what they are made of: priorities, model names, kinds, tenants, and a job's place.

Work waits in RQ queues, one per tenant within each *band* (a model, kind and priority):
``gpuq:<model>:<kind>:<priority>:<tenant>``, and ``gpuq:<model>:<kind>:<priority>`` (the band's
own name) for jobs that belong to no tenant. Workers take from a band's queues by fair shares
(``gpuq.jobs.fair``). A worker's *lane* (``gpuq.jobs.prefix_routing``: jobs placed on it by
their prompt's start) is a further queue per tenant of the band: ``<band>:<tenant>@<lane>``
(the tenant segment "" for jobs of no tenant), the lane being the worker's name. These names
sit low in the layers because everything above names queues: the store returns a job's
``QueueEntry`` for the rows it changes, the stats name queues, the registry refuses model names
no queue could carry. The order a worker listens in is ``gpuq.jobs.queues``'s.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import NamedTuple, Protocol

from gpuq import redis_keys
from gpuq.db.tables import JobKind

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Priority(enum.IntEnum):
    """Lower value runs first. Names are what users type; values order queues."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(p.label for p in cls)
            raise ValueError(f"unknown priority {name!r}; use one of: {choices}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


def is_valid_model_name(name: str) -> bool:
    """Model names become part of queue names, so they are kept to a safe alphabet."""
    return bool(_MODEL_NAME.match(name))


KINDS = frozenset(kind.value for kind in JobKind)


_TENANT_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def tenant_segment(owner: str | None) -> str:
    """A tenant as its queues name it: the owner as it is where it is in the keys API's alphabet
    (so ``rq info`` reads it), else ``~`` and its UTF-8 in hex; "" for jobs of no tenant."""
    if not owner:
        return ""
    if _TENANT_SAFE.match(owner):
        return owner
    return "~" + owner.encode().hex()


def band_name(model: str, kind: str, priority: Priority) -> str:
    """A band's name (a model, kind and priority): the queue of its jobs of no tenant, and the
    stem of its tenants' queues."""
    if not is_valid_model_name(model):
        raise ValueError(f"invalid model name {model!r}")
    if kind not in KINDS:
        raise ValueError(f"invalid job kind {kind!r}")
    return redis_keys.queue_name(model, kind, priority.label)


def queue_name(model: str, kind: str, priority: Priority, owner: str | None = None) -> str:
    """The queue a job of ``owner`` (its tenant) waits in."""
    return tenant_queue(band_name(model, kind, priority), tenant_segment(owner))


def tenant_queue(band: str, tenant: str, lane: str = "") -> str:
    """The queue of a band's tenant, by its tenant segment ("": the band's own queue); with
    ``lane``, that tenant's queue in the worker ``lane``'s lane."""
    if lane:
        return f"{band}:{tenant}@{lane}"
    return f"{band}:{tenant}" if tenant else band


_LANE_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def is_valid_lane(lane: str) -> bool:
    """Lanes are worker names (``<host>.<slot>.<pid>.<hex>``), which queue names can carry."""
    return bool(_LANE_SAFE.match(lane))


class QueueName(NamedTuple):
    model: str
    kind: str
    priority: Priority
    tenant: str  # its tenant_segment: "" for the band's queue of jobs of no tenant
    lane: str = ""  # the worker whose lane it is; "" for the band's shared queues

    @property
    def band(self) -> str:
        return band_name(self.model, self.kind, self.priority)

    @property
    def shared(self) -> str:
        """The shared queue of its band and tenant (itself, when it is no lane's)."""
        return tenant_queue(self.band, self.tenant)


def parse_queue(name: str) -> QueueName:
    """Inverse of :func:`queue_name`; refuses names gpuq did not make."""
    parts = name.split(":")
    tenant, lane = (parts[4].split("@", 1) if "@" in parts[4] else (parts[4], "")) if len(parts) == 5 else ("", "")
    if (
        len(parts) not in (4, 5)
        or parts[0] != redis_keys.PREFIX
        or not is_valid_model_name(parts[1])
        or parts[2] not in KINDS
        or (len(parts) == 5 and not lane and not tenant)
        or (tenant and not (_TENANT_SAFE.match(tenant) or re.match(r"^~[0-9a-f]{2,}$", tenant)))
        or (lane and not is_valid_lane(lane))
    ):
        raise ValueError(f"{name!r} is not a gpuq queue name")
    return QueueName(parts[1], parts[2], Priority.parse(parts[3]), tenant, lane)


def parse_queue_name(name: str) -> tuple[str, str, Priority]:
    """(model, kind, priority) of a queue's name; refuses names gpuq did not make."""
    parsed = parse_queue(name)
    return parsed.model, parsed.kind, parsed.priority


class Queueable(Protocol):
    """What a job needs to be queued: a jobs row, a job about to be inserted, a claimed job."""

    @property
    def id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def deadline(self) -> datetime | None: ...


class QueueEntry(NamedTuple):
    """A job's place in Redis: its id in its tenant's queue of its model, kind and priority,
    and its deadline (earliest first within that queue, ``gpuq.jobs.fair``). The store returns
    these for the rows it changes, so callers pass them on as they are."""

    job_id: str
    model: str
    kind: str
    priority: int
    owner: str | None = None  # the tenant: whose fair share it is
    deadline: datetime | None = None
    lane: str = ""  # the worker whose lane it waits in (``gpuq.jobs.placement``); "": the shared queues

    @classmethod
    def of(cls, job: Queueable) -> QueueEntry:
        return cls(job.id, job.model, job.kind, job.priority, job.owner, job.deadline)

    @property
    def deadline_ms(self) -> int | None:
        """The deadline as Redis orders it: milliseconds since the epoch."""
        return None if self.deadline is None else int(self.deadline.timestamp() * 1000)

    @property
    def queue(self) -> str:
        return tenant_queue(self.band, tenant_segment(self.owner), self.lane)

    @property
    def band(self) -> str:
        return band_name(self.model, self.kind, Priority(self.priority))
