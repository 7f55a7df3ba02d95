"""Queues: priorities, queue names and the order a worker listens in.

Work waits in RQ queues named ``gpuq:<model>:<kind>:<priority>``. A worker listens on
the queues of the models and kinds its GPU may run (affinity rules can name a kind),
highest priority first, so RQ's ordered ``BLPOP`` gives priority order for free.
Every Redis key, these queues' included, is named in ``gpuq.redis_keys``.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import NamedTuple, Protocol

from gpuq import redis_keys
from gpuq.db.tables import JobKind

# worker/ imports these two from here; their home is gpuq.redis_keys.

JOB_FUNC = "worker.tasks.run_job"  # named, not imported: the API never imports the worker

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


def parse_queue_name(name: str) -> tuple[str, str, Priority]:
    """Inverse of :func:`queue_name`; refuses names gpuq did not make."""
    parts = name.split(":")
    if len(parts) != 4 or parts[0] != redis_keys.PREFIX or not is_valid_model_name(parts[1]) or parts[2] not in KINDS:
        raise ValueError(f"{name!r} is not a gpuq queue name")
    return parts[1], parts[2], Priority.parse(parts[3])


def worker_queue_names(
    servable: list[tuple[str, str]],
    *,
    loaded: frozenset[str] = frozenset(),
    loaded_elsewhere: frozenset[str] = frozenset(),
    worker: str = "",
) -> list[str]:
    """The order a worker listens in: the HIGH queue of every (model, kind) it serves, then
    every NORMAL queue, then every LOW one. Within a priority:

    1. models this worker has loaded (sticky: no load needed);
    2. models no other worker has loaded (spread: another worker already serves the rest);
    3. the others, which makes this worker a replica when their queues are deep.

    Ties are broken by rendezvous hashing of (worker, model), so idle workers that know
    nothing yet still prefer different models instead of all loading the first one."""

    def rank(pair: tuple[str, str]) -> tuple[bool, bool, str]:
        model = pair[0]
        spread = hashlib.sha1(f"{worker}/{model}".encode()).hexdigest() if worker else ""
        return (model not in loaded, model in loaded_elsewhere, spread)

    ordered = sorted(servable, key=rank)  # stable: keeps the given order when nothing differs
    return [queue_name(model, kind, p) for p in Priority for model, kind in ordered]
