"""How fast a model's workers get through work lately, in tokens: what positions, ETAs and
the refusal of a job that cannot meet its deadline divide the work ahead by.

Read from the jobs that finished in the last ``WINDOW`` (the most recent ``MAX_JOBS`` of
them): their tokens (prompt and completion) over the time at least one of them was running
(the union of their runs, so an idle stretch does not dilute the rate, and jobs decoded side
by side count once). The same jobs say what part of their completion budget (``max_tokens``
times ``n``) jobs of this model really generate, and how long their prompts are: a queued
job's expected completion is its budget times that share, and a queued job whose prompt was
not counted at submission (a batch line short enough to need no count, an embedding) counts
as the mean prompt.

The unit is a token, prompt or completion alike: a model's prompt tokens cost less than its
generated ones, but the rate is measured on the same mix of both that its recent jobs had, so
a queue of the usual mix gets the right figure, and one of unusually long prompts a pessimistic
one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Job

WINDOW = timedelta(minutes=15)  # recent enough to follow load, long enough to smooth it
MAX_JOBS = 5000  # the most recent finished jobs read: enough for a rate, bounded for a busy model


@dataclass(frozen=True, slots=True)
class Throughput:
    jobs: int  # finished in the window, at most MAX_JOBS read
    busy_s: float  # the time at least one of them was running
    tokens: int  # their prompt and completion tokens
    completion_share: float  # of their completion budgets, the part generated (1.0 when none had one)
    mean_prompt_tokens: float  # per job (0.0 when none finished)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens finished per second of work; None when nothing with tokens finished lately."""
        if self.tokens <= 0 or self.busy_s <= 0:
            return None
        return self.tokens / self.busy_s

    def expected_tokens(self, prompt_tokens: int | None, completion_budget: int) -> tuple[float, float]:
        """A queued job's (prompt, completion) tokens as this model's recent jobs suggest."""
        prompt = float(prompt_tokens) if prompt_tokens is not None else self.mean_prompt_tokens
        return prompt, completion_budget * self.completion_share


NONE_LATELY = Throughput(0, 0.0, 0, 1.0, 0.0)


def measure(session: Session, model: str, kind: str, now: datetime) -> Throughput:
    """The model's pace on jobs of this kind over the ``WINDOW`` before ``now``."""
    rows = session.execute(
        select(Job.started_at, Job.finished_at, Job.prompt_tokens, Job.completion_tokens, store.completion_budget_sql())
        .where(
            Job.model == model,
            Job.kind == kind,
            Job.finished_at >= now - WINDOW,
            Job.finished_at <= now,
            Job.started_at.is_not(None),
        )
        .order_by(Job.finished_at.desc())
        .limit(MAX_JOBS)
    ).all()
    if not rows:
        return NONE_LATELY
    runs = [(started, finished) for started, finished, *_rest in rows if started and finished]
    prompt = sum(r[2] or 0 for r in rows)
    completion = sum(r[3] or 0 for r in rows)
    budgeted = [(r[3] or 0, r[4] or 0) for r in rows if (r[4] or 0) > 0]
    budget = sum(b for _c, b in budgeted)
    share = min(1.0, sum(c for c, _b in budgeted) / budget) if budget else 1.0
    return Throughput(len(rows), busy_seconds(runs), prompt + completion, share, prompt / len(rows))


def busy_seconds(runs: list[tuple[datetime, datetime]]) -> float:
    """The length of the union of these intervals: runs that overlap count once."""
    total = 0.0
    end: datetime | None = None
    start: datetime | None = None
    for run_start, run_end in sorted(runs):
        if end is None or run_start > end:
            if start is not None and end is not None:
                total += (end - start).total_seconds()
            start, end = run_start, run_end
        elif run_end > end:
            end = run_end
    if start is not None and end is not None:
        total += (end - start).total_seconds()
    return total
