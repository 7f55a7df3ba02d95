"""Rebuilding Redis from SQL: the reason no job is ever lost.

Two repairs, both safe to run from any number of processes at once (the worker's
conditional claim makes a duplicate queue entry harmless):

* a row SQL says is ``queued`` but Redis has no live entry for is enqueued again. An
  entry is live when RQ's hash says ``queued`` and the id is in its queue, or ``started``
  by a worker that is alive (and about to claim it). So this covers Redis restarted empty,
  the API dying between its commit and its enqueue, a worker that popped the job and then
  died or froze before starting it (RQ's ``BLPOP`` is not reliable: the id is then in no
  list while the hash still says ``queued``), and a live worker that started it in Redis
  but never claimed it (Redis went down before its reply to the start: the worker took the
  start as not written and forgot the job). A popped job is in no list for the milliseconds
  before its worker starts it, and a started one unclaimed for the milliseconds before its
  claim, so such an entry is re-enqueued only when a pass at least ``IN_FLIGHT_LIMIT_S``
  earlier saw it so too (``LOST_SUSPECTS_KEY``); should its worker claim it after all, the
  second entry's claim fails and that entry is dropped;
* a row SQL says is ``running`` on a worker whose heartbeat has expired goes back to
  the queue, or fails once it has used up its attempts. Jobs that died together on one
  worker are not charged the attempt and run alone next (``RUN_ALONE_KEY``). Before that,
  the outcomes such a worker spooled during a database outage are written
  (``gpuq.jobs.outcome_spool``; from Redis, or from files when Redis was down too and this
  scheduler shares the workers' data directory): those jobs finished, and are not run again;
* a row SQL says is ``running`` on a live worker that runs no execution of it and has no
  outcome of it on the way (its claim committed but the worker never learned so) goes
  back to the queue, uncharged, once two passes ``orphan_limit_s`` apart saw it so;
* the fair pick's state (``gpuq.jobs.fair``): the tenants' weights are rewritten from SQL,
  and a non-empty tenant queue missing from its band's flows (a push that bypassed gpuq,
  such as ``rq requeue``) is added back. A job re-enqueued here goes to its tenant's queue.

Both judgements about workers rest on their keys in Redis, so they wait while Redis is
new to this system: for ``redis_settle_s`` after it restarted empty (``REDIS_EPOCH_KEY``
missing), live workers re-register (their next heartbeat finds their hash gone), and
until then a missing key proves nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import cast

from redis import Redis
from redis.typing import EncodableT, FieldT
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from gpuq.jobs import fair, outcome_spool
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.jobs.prefix_routing import hand_back_lanes
from gpuq.queue_names import QueueEntry
from gpuq.redis_keys import (
    LOST_SUSPECTS_KEY,
    ORPHAN_SUSPECTS_KEY,
    REDIS_EPOCH_KEY,
    RUN_ALONE_KEY,
    RUN_ALONE_TTL_S,
    SUSPECTS_TTL_S,
    outcome_spool_key,
    rq_job_key,
    rq_queue_key,
    rq_started_key,
    rq_worker_executions_key,
    rq_worker_key,
)
from gpuq.stats import metrics

log = logging.getLogger(__name__)

IN_FLIGHT_LIMIT_S = 5.0
# A running row with no execution on its live worker, for longer than this, is orphaned.
# It must exceed the gap between a job's end (its execution removed) and the commit of its
# outcome, which a database outage stretches: so a worker TTL (the scheduler passes it).
ORPHAN_LIMIT_S = 60.0


@dataclass
class ReconcileReport:
    requeued: list[str] = field(default_factory=list)  # queued in SQL, missing in Redis
    recovered: list[str] = field(default_factory=list)  # running on a dead worker, queued again
    failed: list[str] = field(default_factory=list)  # running on a dead worker, out of attempts
    spooled: list[str] = field(default_factory=list)  # finished on a dead worker during an outage: written
    orphaned: list[str] = field(default_factory=list)  # running where no worker runs it, queued again
    handed_back: int = 0  # jobs of lanes of dead, drained or no longer serving workers, back in the shared queues


def reconcile_once(
    session: Session,
    redis: Redis,
    *,
    grace_s: float,
    max_attempts: int,
    timeout_s: int,
    in_flight_limit_s: float = IN_FLIGHT_LIMIT_S,
    orphan_limit_s: float = ORPHAN_LIMIT_S,
    redis_settle_s: float = ORPHAN_LIMIT_S,
    spool_dir: Path | None = None,
) -> ReconcileReport:
    """One pass. ``spool_dir``: where this machine's workers spool outcomes to files when
    Redis is down too (a scheduler sharing their data directory, as in ``gpuq up``)."""
    report = ReconcileReport()
    fair.sync_weights(session, redis)
    settled = redis_age_s(redis) >= redis_settle_s
    if settled:
        _write_spools_of_dead_workers(session, redis, report=report, spool_dir=spool_dir)
        # Before the lost entries' round reads the queues (each lane queue moves in one script).
        report.handed_back = hand_back_lanes(redis)
    _requeue_lost_entries(
        session, redis, grace_s=grace_s, timeout_s=timeout_s, in_flight_limit_s=in_flight_limit_s, report=report
    )
    if settled:
        _recover_from_dead_workers(session, redis, max_attempts=max_attempts, timeout_s=timeout_s, report=report)
        _requeue_orphans(session, redis, limit_s=orphan_limit_s, timeout_s=timeout_s, report=report)
    fair.register_flows(redis)
    if report.requeued or report.recovered or report.failed or report.spooled or report.orphaned or report.handed_back:
        log.warning(
            "reconciler: %d re-enqueued, %d recovered from dead workers, %d failed, "
            "%d outcomes written from spools, %d orphans re-enqueued, %d jobs of lanes handed back",
            len(report.requeued),
            len(report.recovered),
            len(report.failed),
            len(report.spooled),
            len(report.orphaned),
            report.handed_back,
        )
    return report


def redis_age_s(redis: Redis) -> float:
    """Seconds since this Redis's data began, as far as gpuq knows: 0 the first time it is
    asked after Redis restarted empty (the marker is set then)."""
    now = time.time()
    redis.set(REDIS_EPOCH_KEY, now, nx=True)
    began = redis.get(REDIS_EPOCH_KEY)
    return now - float(began) if began is not None else 0.0


def _write_spools_of_dead_workers(
    session: Session, redis: Redis, *, report: ReconcileReport, spool_dir: Path | None
) -> None:
    spooling = outcome_spool.spooling_workers(redis)
    for worker in spooling - _live_workers(redis, spooling):
        report.spooled.extend(outcome_spool.apply_spool(session, redis, worker))
    if spool_dir is not None:
        report.spooled.extend(outcome_spool.apply_file_spools(session, redis, spool_dir))


def _requeue_lost_entries(
    session: Session, redis: Redis, *, grace_s: float, timeout_s: int, in_flight_limit_s: float, report: ReconcileReport
) -> None:
    # Young rows may be between the API's commit and its enqueue; leave them a moment.
    queued = store.queued_jobs_created_before(session, utcnow() - timedelta(seconds=grace_s))
    with redis.pipeline(transaction=False) as pipe:
        for entry in queued:
            pipe.hmget(rq_job_key(entry.job_id), "status", "origin", "worker_name")
        hashes: list[list[bytes | None]] = pipe.execute()
    waiting = _waiting_ids(redis, {origin for status, origin, _w in hashes if status == b"queued" and origin})
    starters = {worker.decode() for status, _o, worker in hashes if status == b"started" and worker}
    alive = _live_workers(redis, starters)
    lost, in_flight = [], []
    for entry, (status, _origin, worker) in zip(queued, hashes, strict=True):
        if status == b"queued":
            if entry.job_id.encode() not in waiting:
                in_flight.append(entry)
        elif status == b"started" and worker is not None and worker.decode() in alive:
            # Started and not yet claimed: its worker is between the two, for milliseconds,
            # or it never learned that its start was written (Redis went down before the
            # reply came) and has forgotten the job.
            in_flight.append(entry)
        else:
            lost.append(entry)  # no hash (Redis lost it), or ended, failed, or started by a dead worker
    lost.extend(_persisting(redis, LOST_SUSPECTS_KEY, in_flight, limit_s=in_flight_limit_s))
    if lost:
        _forget_dead_executions(redis, [e.job_id for e in lost])
        enqueue_jobs(redis, lost, timeout_s=timeout_s)
        report.requeued.extend(e.job_id for e in lost)


def _waiting_ids(redis: Redis, queue_names: set[bytes]) -> set[bytes]:
    """The ids in these RQ queues, read in one MULTI so the snapshot is consistent (aging
    moves ids between queues)."""
    if not queue_names:
        return set()
    with redis.pipeline(transaction=True) as pipe:
        for name in queue_names:
            pipe.lrange(rq_queue_key(name.decode()), 0, -1)
        lists: list[list[bytes]] = pipe.execute()
    return {job_id for ids in lists for job_id in ids}


def _persisting(redis: Redis, key: str, candidates: list[QueueEntry], *, limit_s: float) -> list[QueueEntry]:
    """Of the candidates of this pass, those an earlier pass saw as candidates ``limit_s``
    ago; the others are remembered in ``key`` (with when first seen) for the next pass."""
    now = time.time()
    seen: dict[bytes, bytes] = redis.hgetall(key) if candidates else {}  # type: ignore[assignment]
    overdue: list[QueueEntry] = []
    remembered: dict[FieldT, EncodableT] = {}
    for entry in candidates:
        first_seen = float(seen.get(entry.job_id.encode(), now))
        if now - first_seen >= limit_s:
            overdue.append(entry)
        else:
            remembered[entry.job_id] = first_seen
    with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if remembered:
            pipe.hset(key, mapping=remembered)
            pipe.expire(key, SUSPECTS_TTL_S)
        pipe.execute()
    return overdue


def _live_workers(redis: Redis, names: set[str]) -> set[str]:
    ordered = sorted(names)
    with redis.pipeline(transaction=False) as pipe:
        for name in ordered:
            key = rq_worker_key(name)
            pipe.exists(key)
            pipe.hexists(key, "death")
        flags = pipe.execute()
    return {name for name, exists, dead in zip(ordered, flags[::2], flags[1::2], strict=True) if exists and not dead}


def _recover_from_dead_workers(
    session: Session, redis: Redis, *, max_attempts: int, timeout_s: int, report: ReconcileReport
) -> None:
    running = store.running_jobs(session)
    if not running:
        return
    alive = _live_workers(redis, {r.worker for r in running if r.worker})
    died_with = Counter(job.worker for job in running if job.worker not in alive)
    _forget_dead_executions(redis, [job.entry.job_id for job in running if job.worker not in alive])
    back: list[QueueEntry] = []
    alone: list[str] = []
    for job in running:
        if job.worker in alive:
            continue
        entry, worker = job.entry, job.worker
        if died_with[worker] > 1:
            # Several jobs went down together (continuous batching): which one crashed the
            # worker is unknown, so none is charged; each runs alone next, where a job that
            # crashes its worker again is charged as usual.
            if store.return_to_queue(
                session, entry.job_id, worker=worker, reason=_died(worker, died_with[worker]), refund_attempt=True
            ):
                back.append(entry)
                alone.append(entry.job_id)
        elif job.attempts >= max_attempts:
            _give_up(session, redis, job, report)
        elif store.return_to_queue(session, entry.job_id, worker=worker, reason=_died(worker, 1)):
            back.append(entry)
    if alone:
        _mark_run_alone(redis, alone)
    if back:
        enqueue_jobs(redis, back, timeout_s=timeout_s)
        report.recovered.extend(e.job_id for e in back)


def _forget_dead_executions(redis: Redis, job_ids: list[str]) -> None:
    """The started-registry entries of runs that ended without their worker (it died, or
    forgot a start it did not know was written), before their jobs are queued again or
    failed. RQ's own cleanup of that registry runs only over a worker's listed queues (gpuq's
    bands, never the tenants' queues and lanes a job's entry is under), and would judge a job
    by its hash, which its next run shares: SQL knows these runs ended."""
    if not job_ids:
        return
    with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(rq_job_key(job_id), "origin")
        origins = cast(list[bytes | None], pipe.execute())
    registries = {rq_started_key(origin.decode()) for origin in origins if origin}
    with redis.pipeline(transaction=False) as pipe:
        for key in sorted(registries):
            pipe.zrange(key, 0, -1)
        members = dict(zip(sorted(registries), cast(list[list[bytes]], pipe.execute()), strict=True))
    dead = {job_id.encode() for job_id in job_ids}
    with redis.pipeline(transaction=False) as pipe:
        for key, entries in members.items():
            gone = [e for e in entries if e.split(b":", 1)[0] in dead]
            if gone:
                pipe.zrem(key, *gone)
        pipe.execute()


def _requeue_orphans(
    session: Session, redis: Redis, *, limit_s: float, timeout_s: int, report: ReconcileReport
) -> None:
    running = [job for job in store.running_jobs(session) if job.worker]
    workers = sorted(_live_workers(redis, {job.worker for job in running if job.worker}))
    with redis.pipeline(transaction=False) as pipe:
        for worker in workers:
            pipe.smembers(rq_worker_executions_key(worker))
            pipe.hkeys(outcome_spool_key(worker))
        replies = pipe.execute()
    accounted: dict[str, set[str]] = {}  # worker -> jobs it runs or has an outcome of on the way
    for worker, executions, spooled in zip(workers, replies[::2], replies[1::2], strict=True):
        running_there = {composite.decode().split(":", 1)[0] for composite in executions}
        accounted[worker] = running_there | {job_id.decode() for job_id in spooled}
    orphans = [
        job.entry for job in running if job.worker in accounted and job.entry.job_id not in accounted[job.worker]
    ]
    workers_of = {job.entry.job_id: job.worker for job in running}
    back = [
        entry
        for entry in _persisting(redis, ORPHAN_SUSPECTS_KEY, orphans, limit_s=limit_s)
        if store.return_to_queue(
            session, entry.job_id, worker=workers_of[entry.job_id], reason=ORPHAN_REASON, refund_attempt=True
        )
    ]
    if back:
        enqueue_jobs(redis, back, timeout_s=timeout_s)
        report.orphaned.extend(e.job_id for e in back)


ORPHAN_REASON = "running on a live worker that had no execution of it (a claim whose acknowledgement was lost)"


def _died(worker: str | None, together: int) -> str:
    """Why a dead worker's run ended, as its job's run history shows it."""
    if together > 1:
        return f"worker {worker} died with {together} jobs running; not charged, run alone next"
    return f"worker {worker} died while running it"


def _give_up(session: Session, redis: Redis, job: store.RunningJob, report: ReconcileReport) -> None:
    entry, worker = job.entry, job.worker
    error = f"worker {worker} stopped responding while running this job; gave up after {job.attempts} attempts"
    if store.fail_abandoned_job(session, entry.job_id, worker=worker, error=error):
        report.failed.append(entry.job_id)
        metrics.record_finished_jobs(redis, [metrics.FinishedJob(entry.model, entry.kind, JobStatus.FAILED.value)])


def _mark_run_alone(redis: Redis, job_ids: list[str]) -> None:
    with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(RUN_ALONE_KEY, *job_ids)
        pipe.expire(RUN_ALONE_KEY, RUN_ALONE_TTL_S)
        pipe.execute()
