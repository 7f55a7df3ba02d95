"""The work waiting, in tokens: per model, the prompt tokens of its queued jobs and the
completion tokens they may ask for (their ``max_tokens``), for autoscalers that size a fleet
by work rather than by jobs (``/metrics``: ``gpuq_queued_prompt_tokens``,
``gpuq_queued_completion_tokens``). A job's row is the record of both (SQL), so the figures
hold whatever Redis holds."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuq.db.tables import Job, JobStatus


@dataclass(frozen=True, slots=True)
class Backlog:
    jobs: int
    prompt_tokens: int  # counted at submission; jobs the API did not count add none
    completion_tokens: int  # the most they may generate: max_tokens times n, summed


def queued_tokens(session: Session) -> dict[str, Backlog]:
    """Each model with queued jobs, and their tokens."""
    request = Job.request
    completion = func.coalesce(request["max_tokens"].as_integer(), 0) * func.coalesce(request["n"].as_integer(), 1)
    rows = session.execute(
        select(
            Job.model,
            func.count(),
            func.coalesce(func.sum(Job.prompt_tokens), 0),
            func.coalesce(func.sum(completion), 0),
        )
        .where(Job.status == JobStatus.QUEUED)
        .group_by(Job.model)
    )
    return {model: Backlog(int(n), int(prompt), int(done)) for model, n, prompt, done in rows}
