"""Outcomes that wait in Redis while the database cannot take them.

A worker's outcome writer retries a failed commit until it succeeds, but its memory dies
with it: a worker stopped or killed during a database outage would lose the outcomes of
the jobs it finished, and the reconciler would run those jobs again. So the first time a
commit fails, the writer also copies its outcomes here (a hash per worker); it deletes
them once written. The reconciler applies the spool of a worker that died, before it
recovers that worker's running jobs, and never reads a live worker's spool except to
know which of its jobs have an outcome on the way. Applying is the same conditional write
as the worker's (only rows still running on that worker change), so doing it twice, or
late, changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any, cast

from redis import Redis
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import JobStatus
from gpuq.redis_keys import OUTCOME_SPOOL_TTL_S, OUTCOME_SPOOLS_KEY, outcome_spool_key
from gpuq.stats import metrics
from gpuq.stats.metrics import FinishedJob

Pending = tuple[store.Outcome, FinishedJob | None]


def _encode(outcome: store.Outcome, finished: FinishedJob | None) -> str:
    values = asdict(outcome) | {"status": outcome.status.value, "finished_at": outcome.finished_at.isoformat()}
    return json.dumps({"outcome": values, "finished": asdict(finished) if finished is not None else None})


def _decode(raw: bytes) -> Pending:
    data: dict[str, Any] = json.loads(raw)
    values = data["outcome"]
    values["status"] = JobStatus(values["status"])
    values["finished_at"] = datetime.fromisoformat(values["finished_at"])
    finished = data["finished"]
    return store.Outcome(**values), FinishedJob(**finished) if finished is not None else None


def spool(redis: Redis, worker: str, pending: Sequence[Pending]) -> None:
    key = outcome_spool_key(worker)
    with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping={outcome.job_id: _encode(outcome, finished) for outcome, finished in pending})
        pipe.expire(key, OUTCOME_SPOOL_TTL_S)
        pipe.sadd(OUTCOME_SPOOLS_KEY, worker)
        pipe.execute()


def unspool(redis: Redis, worker: str, job_ids: Iterable[str]) -> None:
    """The outcomes are in SQL now."""
    ids = list(job_ids)
    if ids:
        redis.hdel(outcome_spool_key(worker), *ids)


def _texts(replies: Iterable[bytes | str]) -> set[str]:
    return {reply.decode() if isinstance(reply, bytes) else reply for reply in replies}


def spooling_workers(redis: Redis) -> set[str]:
    return _texts(redis.smembers(OUTCOME_SPOOLS_KEY))


def apply_spool(session: Session, redis: Redis, worker: str) -> list[str]:
    """Writes a (dead) worker's spooled outcomes to SQL and drops the spool; returns the
    jobs whose rows it changed."""
    key = outcome_spool_key(worker)
    pending = [_decode(raw) for raw in cast(list[bytes], redis.hvals(key))]
    written = store.record_outcomes_written(session, [outcome for outcome, _ in pending]) if pending else set()
    counts = [finished for outcome, finished in pending if finished is not None and outcome.job_id in written]
    if counts:
        metrics.record_finished_jobs(redis, counts)
    with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.srem(OUTCOME_SPOOLS_KEY, worker)
        pipe.execute()
    return sorted(written)
