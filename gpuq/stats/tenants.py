"""Each tenant's share of the fleet: now (its jobs running, of all running) and over a window
(the run time of its jobs that finished in it, of all such run time), for the dashboard's
view of fair shares (``gpuq.jobs.fair``).

Run time is each job's ``run_ms``: with continuous batching several jobs run at once on one
GPU, so a share is of the slots' time, which is what the fair pick divides between tenants.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuq.db.tables import Job, JobStatus

NO_TENANT = ""  # jobs of no tenant (from before keys existed), shown as such


@dataclass(frozen=True, slots=True)
class TenantShare:
    tenant: str
    queued: int
    running: int
    share_now: float  # of all jobs running now; 0 when none runs
    finished: int  # in the window
    run_s: float  # summed run time of those jobs
    share_window: float  # of all run time of jobs finished in the window; 0 when none


def tenant_shares(session: Session, *, since: datetime, until: datetime) -> list[TenantShare]:
    """Every tenant with a job queued or running now or finished in [since, until), the
    largest share now first."""
    live = session.execute(
        select(Job.owner, Job.status, func.count())
        .where(Job.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
        .group_by(Job.owner, Job.status)
    )
    queued: dict[str, int] = {}
    running: dict[str, int] = {}
    for owner, status, n in live:
        (running if status == JobStatus.RUNNING else queued)[owner or NO_TENANT] = int(n)
    done = session.execute(
        select(Job.owner, func.count(), func.coalesce(func.sum(Job.run_ms), 0))
        .where(Job.finished_at >= since, Job.finished_at < until, Job.run_ms.is_not(None))
        .group_by(Job.owner)
    )
    finished: dict[str, tuple[int, float]] = {
        owner or NO_TENANT: (int(n), int(ms or 0) / 1000) for owner, n, ms in done
    }
    all_running = sum(running.values())
    all_run_s = sum(s for _n, s in finished.values())
    shares = [
        TenantShare(
            tenant=tenant,
            queued=queued.get(tenant, 0),
            running=running.get(tenant, 0),
            share_now=round(running.get(tenant, 0) / all_running, 4) if all_running else 0.0,
            finished=finished.get(tenant, (0, 0.0))[0],
            run_s=round(finished.get(tenant, (0, 0.0))[1], 3),
            share_window=round(finished.get(tenant, (0, 0.0))[1] / all_run_s, 4) if all_run_s else 0.0,
        )
        for tenant in set(queued) | set(running) | set(finished)
    ]
    return sorted(shares, key=lambda s: (-s.share_now, -s.share_window, s.tenant))
