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

When Redis is down too, the outcomes go to a file instead: one per failed commit, in
``<data_dir>/outcome-spool/`` (0700; files 0600, as they hold tenants' results), written
whole and fsynced before it is renamed into place, removed once the commit succeeds. A
worker starting on that machine, and the reconciler of a scheduler that shares the data
directory (``gpuq up``), write the files of workers that are not alive, the same way.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from redis import Redis
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import JobStatus
from gpuq.fleet.workers import live_workers
from gpuq.private_files import open_private, private_dir
from gpuq.redis_keys import OUTCOME_SPOOL_TTL_S, OUTCOME_SPOOLS_KEY, outcome_spool_key
from gpuq.stats import metrics
from gpuq.stats.metrics import FinishedJob

log = logging.getLogger(__name__)

Pending = tuple[store.Outcome, FinishedJob | None]
FILE_SUFFIX = ".jsonl"


def _encode(outcome: store.Outcome, finished: FinishedJob | None) -> str:
    values = asdict(outcome) | {"status": outcome.status.value, "finished_at": outcome.finished_at.isoformat()}
    return json.dumps({"outcome": values, "finished": asdict(finished) if finished is not None else None})


def _decode(raw: bytes) -> Pending:
    data: dict[str, Any] = json.loads(raw)
    values = data["outcome"]
    values["status"] = JobStatus(values["status"])
    values["finished_at"] = datetime.fromisoformat(values["finished_at"])
    values.pop("attempt", None)  # spooled when attempts fenced outcomes: written unfenced, as before that
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


# ---------------------------------------------------------------- when Redis is down too


def spool_dir(data_dir: Path) -> Path:
    return data_dir / "outcome-spool"


def spool_to_file(directory: Path, pending: Sequence[Pending]) -> Path:
    """The outcomes in a new file of ``directory``, on disk before this returns; the file, for
    ``unspool_file`` once they are in SQL."""
    private_dir(directory)
    path = directory / f"{secrets.token_hex(8)}{FILE_SUFFIX}"
    part = path.with_suffix(".part")
    with open_private(part, exclusive=True) as out:
        out.write("".join(_encode(outcome, finished) + "\n" for outcome, finished in pending).encode())
        out.flush()
        os.fsync(out.fileno())
    part.rename(path)  # whole or absent: a reader never sees half a file
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename too
    finally:
        os.close(directory_fd)
    return path


def unspool_file(path: Path) -> None:
    """Its outcomes are in SQL now."""
    path.unlink(missing_ok=True)


def apply_file_spools(session: Session, redis: Redis, directory: Path) -> list[str]:
    """Writes the spooled files of workers that are not alive (each file names its worker in
    its outcomes) and removes them; returns the jobs whose rows changed. A live worker's files
    are its own to write."""
    files = sorted(directory.glob(f"*{FILE_SUFFIX}")) if directory.is_dir() else []
    if not files:
        return []
    alive = {worker.name for worker in live_workers(redis)}
    written: set[str] = set()
    for path in files:
        try:
            pending = [_decode(line) for line in path.read_bytes().splitlines() if line.strip()]
        except (OSError, ValueError, TypeError, KeyError):
            log.exception("cannot read the spooled outcomes in %s; left for an operator", path)
            continue
        if pending and pending[0][0].worker in alive:
            continue
        changed = store.record_outcomes_written(session, [outcome for outcome, _ in pending]) if pending else set()
        counts = [finished for outcome, finished in pending if finished is not None and outcome.job_id in changed]
        if counts:
            metrics.record_finished_jobs(redis, counts)
        unspool_file(path)
        written |= changed
    return sorted(written)
