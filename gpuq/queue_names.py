"""Queue names and what they are made of: priorities, model names, kinds, and a job's place.

Work waits in RQ queues named ``gpuq:<model>:<kind>:<priority>``. These names sit low in the
layers because everything above names queues: the store returns a job's ``QueueEntry`` for the
rows it changes, the stats name queues, the registry refuses model names no queue could carry.
The order a worker listens in is ``gpuq.jobs.queues``'s.
"""

from __future__ import annotations

import enum
import re
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


def queue_name(model: str, kind: str, priority: Priority) -> str:
    if not is_valid_model_name(model):
        raise ValueError(f"invalid model name {model!r}")
    if kind not in KINDS:
        raise ValueError(f"invalid job kind {kind!r}")
    return redis_keys.queue_name(model, kind, priority.label)


def parse_queue_name(name: str) -> tuple[str, str, Priority]:
    """Inverse of :func:`queue_name`; refuses names gpuq did not make."""
    parts = name.split(":")
    if len(parts) != 4 or parts[0] != redis_keys.PREFIX or not is_valid_model_name(parts[1]) or parts[2] not in KINDS:
        raise ValueError(f"{name!r} is not a gpuq queue name")
    return parts[1], parts[2], Priority.parse(parts[3])


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


class QueueEntry(NamedTuple):
    """A job's place in Redis: its id in the queue of its model, kind and priority. The store
    returns these for the rows it changes, so callers pass them on as they are."""

    job_id: str
    model: str
    kind: str
    priority: int

    @classmethod
    def of(cls, job: Queueable) -> QueueEntry:
        return cls(job.id, job.model, job.kind, job.priority)

    @property
    def queue(self) -> str:
        return queue_name(self.model, self.kind, Priority(self.priority))
