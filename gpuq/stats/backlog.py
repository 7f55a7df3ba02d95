"""The work waiting, in tokens: per model, the prompt tokens of its queued jobs and the
completion tokens they may ask for (their ``max_tokens`` times ``n``), for autoscalers that
size a fleet by work rather than by jobs (``/metrics``: ``gpuq_queued_prompt_tokens``,
``gpuq_queued_completion_tokens``), and how many queued jobs are past their deadline
(``gpuq_queued_jobs_past_deadline``). A job's row is the record of all of it (SQL), so the
figures are exact whatever Redis holds, and known with Redis down too.

A queued job whose prompt was not counted at submission (a batch line whose size proves it
fits, an embedding) counts as the mean prompt of the model's jobs that finished in the last
``throughput.WINDOW`` (the worker counts every prompt it runs), as positions count it; none
when nothing finished lately."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Job, JobStatus, utcnow
from gpuq.stats.throughput import WINDOW


@dataclass(frozen=True, slots=True)
class Backlog:
    jobs: int
    counted_prompt_tokens: int  # counted at submission
    uncounted: int  # jobs whose prompt was not counted
    mean_prompt_tokens: float  # of the model's recently finished jobs: what an uncounted prompt counts as
    completion_tokens: int  # the most they may generate: max_tokens times n, summed
    past_deadline: int  # jobs still queued after their deadline

    @property
    def prompt_tokens(self) -> int:
        return self.counted_prompt_tokens + round(self.uncounted * self.mean_prompt_tokens)


NOTHING = Backlog(0, 0, 0, 0.0, 0, 0)  # a model with nothing queued: its gauges read 0, not absent


def queued_tokens(session: Session, *, now: datetime | None = None) -> dict[str, Backlog]:
    """Each model with queued jobs, and their tokens."""
    now = now or utcnow()
    rows = session.execute(
        select(
            Job.model,
            func.count(),
            func.coalesce(func.sum(Job.prompt_tokens), 0),
            func.count() - func.count(Job.prompt_tokens),
            func.coalesce(func.sum(store.completion_budget_sql()), 0),
            func.coalesce(func.sum(case((Job.deadline < now, 1), else_=0)), 0),
        )
        .where(Job.status == JobStatus.QUEUED)
        .group_by(Job.model)
    ).all()
    means = _recent_mean_prompts(session, [model for model, _n, _p, uncounted, *_rest in rows if uncounted], now)
    return {
        model: Backlog(int(n), int(prompt), int(uncounted), means.get(model, 0.0), int(budget), int(late))
        for model, n, prompt, uncounted, budget, late in rows
    }


def _recent_mean_prompts(session: Session, models: list[str], now: datetime) -> dict[str, float]:
    if not models:
        return {}
    rows = session.execute(
        select(Job.model, func.avg(Job.prompt_tokens))
        .where(Job.finished_at >= now - WINDOW, Job.model.in_(models), Job.prompt_tokens.is_not(None))
        .group_by(Job.model)
    )
    return {model: float(mean) for model, mean in rows if mean is not None}
