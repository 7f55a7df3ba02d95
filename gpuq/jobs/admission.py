"""Admission by work: a job with a deadline that the fleet cannot meet is refused at submission.

A job's ``deadline`` says when it is needed by; a batch's lines are needed by the end of its
completion window. Such a job goes first among its tenant's jobs of its priority, earliest
deadline first (``gpuq.jobs.fair``). Before it is stored, its place is worked out as a
position is (``gpuq.jobs.position``): the jobs the pick would give out before it, in tokens,
plus its own tokens (a batch's: all its lines of that model and kind, the last of which must
be done by the deadline), over the model's recent tokens per second
(``gpuq.stats.throughput``). When that ends after the deadline the request is refused with a
429 whose ``Retry-After`` is how late it would be: the time for that much of the work ahead to
drain, after which a request with as much time to spare fits.

Nothing is refused on a guess: a model that has finished nothing with tokens lately (idle for
``throughput.WINDOW``, or new) has no pace to judge by, and its jobs are accepted. The promise
is the one a queue can make at submission: later arrivals of a higher priority, or of its own
tenant with earlier deadlines, can still push an accepted job past its deadline; it then
still runs, first of its tenant's jobs of its priority, and the queued jobs past their
deadline are on ``/metrics`` (``gpuq_queued_jobs_past_deadline``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from anyio import to_thread
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import JobKind, utcnow
from gpuq.errors import RequestError, queue_unavailable
from gpuq.jobs import fair
from gpuq.jobs.position import Ahead, Work, jobs_ahead, pace_of, work_ahead
from gpuq.queue_names import Priority, queue_name, tenant_segment

DEADLINE_CODE = "deadline_unreachable"


@dataclass(frozen=True, slots=True)
class Planned:
    """Jobs of one queue (model, kind, priority, tenant) about to be queued, all needed by one
    deadline: one job, or a batch's lines of that model and kind."""

    model: str
    kind: str
    priority: Priority
    owner: str | None
    deadline: datetime
    jobs: int
    prompt_tokens: int  # counted at submission, summed
    uncounted: int  # jobs whose prompt was not counted: each counts at the model's recent mean
    completion_budget: int  # max_tokens times n, summed

    @property
    def queue(self) -> str:
        return queue_name(self.model, self.kind, self.priority, self.owner)


@dataclass(frozen=True, slots=True)
class Verdict:
    eta_s: float | None  # until the last of the planned jobs is done; None when the model's pace is unknown
    late_by_s: float  # after the deadline (0 when in time)
    tokens_per_s: float | None
    work: Work  # ahead of it and its own


def _place(redis: Redis, planned: Planned) -> Ahead:
    """The Redis half: the jobs the pick would give out before the last planned job."""
    deadline_ms = int(planned.deadline.timestamp() * 1000)
    waiting = fair.place_for(redis, planned.queue, deadline_ms)  # its own tenant's jobs that go first
    last = waiting + planned.jobs - 1
    tenant = tenant_segment(planned.owner)
    return jobs_ahead(redis, planned.model, planned.kind, planned.priority, tenant, last, own_waiting=waiting)


def _judge(session: Session, planned: Planned, ahead: Ahead, now: datetime) -> Verdict:
    """The SQL half: the tokens ahead and its own, at the model's recent pace."""
    pace, _per_min = pace_of(session, planned.model, planned.kind, now)
    own = Work(
        planned.prompt_tokens + planned.uncounted * pace.mean_prompt_tokens,
        planned.completion_budget * pace.completion_share,
    )
    work = work_ahead(session, ahead, pace) + own
    rate = pace.tokens_per_s
    if rate is None:
        return Verdict(None, 0.0, None, work)
    eta = work.tokens / rate
    return Verdict(eta, max(0.0, eta - (planned.deadline - now).total_seconds()), rate, work)


def judge(session: Session, redis: Redis, planned: Planned, *, now: datetime | None = None) -> Verdict:
    """Whether the planned jobs can be done by their deadline, in one thread (a batch's)."""
    try:
        ahead = _place(redis, planned)
    except RedisError as exc:
        raise queue_unavailable(exc) from None
    return _judge(session, planned, ahead, now or utcnow())


async def judge_async(db: AsyncSession, redis: Redis, planned: Planned, *, now: datetime | None = None) -> Verdict:
    try:
        ahead = await to_thread.run_sync(lambda: _place(redis, planned))
    except RedisError as exc:
        raise queue_unavailable(exc) from None
    at = now or utcnow()
    return await db.run_sync(lambda s: _judge(s, planned, ahead, at))


def refuse_late(
    planned: Planned, verdict: Verdict, *, what: str = "the job", where: str = "", param: str = "deadline"
) -> None:
    """A 429 when the verdict says the planned jobs would be done after their deadline."""
    if verdict.late_by_s <= 0 or verdict.eta_s is None or verdict.tokens_per_s is None:
        return
    retry_after = max(1, math.ceil(verdict.late_by_s))
    raise RequestError(
        429,
        f"{where}{what} cannot be done by its deadline ({planned.deadline.isoformat()}): with the work queued ahead "
        f"of it, {round(verdict.work.tokens)} tokens on {planned.model!r} at its recent {verdict.tokens_per_s:.0f} "
        f"tokens/s, it would be done about {verdict.late_by_s:.0f} s late; give a later deadline or a higher "
        f"priority, or retry in {retry_after} s",
        param=param,
        code=DEADLINE_CODE,
        headers={"Retry-After": str(retry_after)},
    )


class Tally:
    """A batch's lines as admission judges them, summed per model and kind while its jobs are
    written (they are never all in memory): each group must be done by the batch's expiry."""

    def __init__(self, priority: Priority, owner: str | None, deadline: datetime) -> None:
        self.priority, self.owner, self.deadline = priority, owner, deadline
        self._groups: dict[tuple[str, str], list[int]] = {}  # (model, kind) -> [jobs, prompt, uncounted, budget]

    def add(self, job: store.NewJob) -> None:
        group = self._groups.setdefault((job.model, job.kind), [0, 0, 0, 0])
        group[0] += 1
        if job.prompt_tokens is not None:
            group[1] += job.prompt_tokens
        elif job.kind != JobKind.NOOP:
            group[2] += 1
        group[3] += store.completion_budget(job.kind, job.request)

    def planned(self) -> list[Planned]:
        return [
            Planned(model, kind, self.priority, self.owner, self.deadline, jobs, prompt, uncounted, budget)
            for (model, kind), (jobs, prompt, uncounted, budget) in sorted(self._groups.items())
        ]

    def refuse_if_late(self, session: Session, redis: Redis) -> None:
        """A 429 (``completion_window``) when the fleet cannot finish a group by the expiry."""
        for planned in self.planned():
            refuse_late(planned, judge(session, redis, planned), what="the batch", param="completion_window")


async def refuse_late_jobs(db: AsyncSession, redis: Redis, planned: Sequence[Planned | None]) -> None:
    """Each job with a deadline judged against the queue as it stands (jobs of one request are
    not judged against each other); ``None`` for jobs without one. The first that would be late
    refuses the request, naming its index when there are several."""
    for i, one in enumerate(planned):
        if one is None:
            continue
        verdict = await judge_async(db, redis, one)
        refuse_late(one, verdict, where=f"jobs[{i}]: " if len(planned) > 1 else "")
