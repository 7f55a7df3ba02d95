"""Every Redis name gpuq uses, in one module.

Work waits in RQ queues named ``gpuq:<model>:<priority>``. A worker listens on the
queues of the models it may run, highest priority first, so RQ's ordered ``BLPOP``
gives priority order for free. gpuq's own keys (cancel flags) share the ``gpuq:``
prefix; RQ's keys keep RQ's own ``rq:`` prefix so RQ's tools still work.
"""

from __future__ import annotations

import enum
import re

PREFIX = "gpuq"
JOB_FUNC = "worker.tasks.run_job"  # named, not imported: the API never imports the worker
CANCEL_FLAG_TTL_S = 24 * 3600

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


def queue_name(model: str, priority: Priority) -> str:
    if not is_valid_model_name(model):
        raise ValueError(f"invalid model name {model!r}")
    return f"{PREFIX}:{model}:{priority.label}"


def parse_queue_name(name: str) -> tuple[str, Priority]:
    """Inverse of :func:`queue_name`; refuses names gpuq did not make."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != PREFIX or not is_valid_model_name(parts[1]):
        raise ValueError(f"{name!r} is not a gpuq queue name")
    return parts[1], Priority.parse(parts[2])


def worker_queue_names(models: list[str]) -> list[str]:
    """The order a worker listens in: every model's HIGH queue, then NORMAL, then LOW."""
    return [queue_name(m, p) for p in Priority for m in models]


def cancel_flag_key(job_id: str) -> str:
    return f"{PREFIX}:cancel:{job_id}"
