"""What a stats question is about: a time window and filters, checked before any query runs.

Every refusal is a ``RequestError(422)`` whose message names the bad value and what is
accepted, so a dashboard or a script can be fixed from the message alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import ApiKey, Gpu, Job, JobKind, Model, utcnow
from gpuq.errors import RequestError
from gpuq.queue_names import Priority

DEFAULT_WINDOW = timedelta(hours=1)
# Long enough for a quarter's trend, short enough that no query reads unbounded history.
MAX_WINDOW = timedelta(days=90)
LISTED_CHOICES = 20  # known values are listed in a message when there are at most this many


@dataclass(frozen=True, slots=True)
class Window:
    """Jobs that finished in [since, until)."""

    since: datetime
    until: datetime

    @property
    def length(self) -> timedelta:
        return self.until - self.since


@dataclass(frozen=True, slots=True)
class StatsFilter:
    """Equality filters on jobs; None means any."""

    model: str | None = None
    kind: str | None = None
    priority: int | None = None
    tenant: str | None = None
    host: str | None = None
    gpu: str | None = None

    @property
    def scoped(self) -> list[tuple[str, str]]:
        """The tenant, host and GPU filters set, as (dimension, value)."""
        pairs = (("tenant", self.tenant), ("host", self.host), ("gpu", self.gpu))
        return [(dim, value) for dim, value in pairs if value is not None]

    @property
    def latency_source(self) -> str:
        """Which histograms answer this filter's percentiles over rolled-up days: "model"
        (``job_latency_daily``: any of model, kind and priority), "dim" (``job_latency_dim_daily``:
        one tenant, host or GPU, alone or with a model), or "rows" (a tenant, host or GPU combined
        with a kind, a priority or another of them: exact from the job rows, which such a filter
        narrows)."""
        scoped = self.scoped
        if not scoped:
            return "model"
        if len(scoped) == 1 and self.kind is None and self.priority is None:
            return "dim"
        return "rows"

    def job_conditions(self) -> list[ColumnElement[bool]]:
        """On the job rows, as the store builds every job filter's."""
        as_jobs = store.JobFilter(
            model=self.model,
            kind=self.kind,
            priority=self.priority,
            owner=self.tenant,
            host=self.host,
            gpu_uuid=self.gpu,
        )
        return store.job_conditions(as_jobs)


def parse_window(since: datetime | None, until: datetime | None, *, now: datetime | None = None) -> Window:
    """The window asked for; default the last hour. Refuses naive, reversed and too-long windows."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise RequestError(
                422, f"`{name}` {value.isoformat()} has no time zone; give one, e.g. 2026-01-31T12:00:00Z"
            )
    if until is None:
        until = now or utcnow()
    if since is None:
        since = until - DEFAULT_WINDOW
    if since >= until:
        raise RequestError(
            422, f"the window is reversed or empty: since {since.isoformat()} is not before until {until.isoformat()}"
        )
    if until - since > MAX_WINDOW:
        raise RequestError(
            422,
            f"the window is {_days(until - since)} long; at most {MAX_WINDOW.days} days: move `since` later "
            "or `until` earlier",
        )
    return Window(since, until)


def _days(span: timedelta) -> str:
    return f"{span.total_seconds() / 86400:.1f} days"


def parse_filter(
    session: Session,
    *,
    model: str | None = None,
    kind: str | None = None,
    priority: Priority | None = None,
    tenant: str | None = None,
    host: str | None = None,
    gpu: str | None = None,
) -> StatsFilter:
    """Filters with each value checked: a typo answers 422 instead of an empty, plausible chart.

    A value is known if the registry (models, API keys' tenants, the GPU inventory) has it
    or some job carries it, so history of a model since unregistered stays reachable. The
    history check is one indexed lookup."""
    if kind is not None and kind not in {k.value for k in JobKind}:
        raise RequestError(422, f"unknown kind {kind!r}; use one of: {', '.join(k.value for k in JobKind)}")
    checks: tuple[tuple[str, str | None, Callable[[], Iterable[str]], ColumnElement[bool]], ...] = (
        ("model", model, lambda: session.scalars(select(Model.name)), Job.model == model),
        ("tenant", tenant, lambda: session.scalars(select(ApiKey.owner).distinct()), Job.owner == tenant),
        ("host", host, lambda: session.scalars(select(Gpu.host).distinct()), Job.host == host),
        ("gpu", gpu, lambda: session.scalars(select(Gpu.uuid)), Job.gpu_uuid == gpu),
    )
    for name, value, registry, in_history in checks:
        if value is None:
            continue
        known = set(registry())
        if value in known or session.scalar(select(Job.id).where(in_history).limit(1)) is not None:
            continue
        raise RequestError(422, _unknown(name, value, known))
    return StatsFilter(model=model, kind=kind, priority=priority, tenant=tenant, host=host, gpu=gpu)


def _unknown(name: str, value: str, known: set[str]) -> str:
    if not known:
        return f"unknown {name} {value!r}: no job and no registered {name} has it"
    if len(known) <= LISTED_CHOICES:
        return f"unknown {name} {value!r}; known: {', '.join(sorted(known))}"
    return f"unknown {name} {value!r}: no job and none of the {len(known)} registered {name}s has it"
