"""Responses (``/v1/responses``) are jobs; what only they need of SQL: forgetting one."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from gpuq.db.tables import FINAL_STATUSES, Job
from gpuq.store._sql import NO_SYNC, commit_changed

_FINAL = tuple(s.value for s in FINAL_STATUSES)


def forget_response(session: Session, job_id: str, *, request: dict[str, Any], result: dict[str, Any] | None) -> bool:
    """Replace a finished job's request and result with ``request`` and ``result`` (its texts
    left out); False if the job is not finished (nothing changed)."""
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.status.in_(_FINAL))
        .values(request=request, result=result)
        .execution_options(**NO_SYNC)
    )
    return commit_changed(session, statement)
