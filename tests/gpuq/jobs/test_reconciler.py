"""The reconciler rebuilds Redis from SQL: lost queue entries and jobs of dead workers."""

import time
from datetime import timedelta
from typing import cast

from redis import Redis
from rq.job import Job as RQJob
from rq.worker import Worker

from gpuq import store
from gpuq.db.tables import utcnow
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.jobs.reconciler import reconcile_once
from gpuq.queue_names import QueueEntry
from gpuq.redis_keys import rq_job_key, rq_started_key
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job

RECONCILE = {"grace_s": 0.0, "max_attempts": 2, "timeout_s": 60, "redis_settle_s": 0.0}


def queue_of(redis: Redis, name: str) -> list[str]:
    entries = cast(list[bytes], redis.lrange(f"rq:queue:gpuq:smollm2-135m:generate:{name}", 0, -1))
    return [x.decode() for x in entries]


@both_databases
def test_queued_rows_with_no_redis_entry_are_enqueued_again_once(session, redis):
    kept, lost = store.insert_jobs(session, [make_job(priority=0), make_job(priority=2)])
    enqueue_jobs(redis, [QueueEntry.of(kept)], timeout_s=60)

    report = reconcile_once(session, redis, **RECONCILE)
    assert report.requeued == [lost.id]
    assert queue_of(redis, "high") == [kept.id] and queue_of(redis, "low") == [lost.id]
    assert reconcile_once(session, redis, **RECONCILE).requeued == []  # idempotent


def test_young_queued_rows_are_left_alone_while_the_api_may_still_be_enqueueing(session, redis):
    store.insert_jobs(session, [make_job()])
    assert reconcile_once(session, redis, **(RECONCILE | {"grace_s": 60})).requeued == []
    assert queue_of(redis, "normal") == []


def _register_worker(redis: Redis, name: str) -> None:
    key = Worker.redis_worker_namespace_prefix + name
    redis.hset(key, "birth", utcnow().isoformat())
    redis.expire(key, 60)


@both_databases
def test_jobs_of_a_dead_worker_go_back_to_the_queue_then_fail_when_out_of_attempts(session, redis):
    alive_job, dead_job = store.insert_jobs(session, [make_job(), make_job()])
    _register_worker(redis, "alive")
    store.claim_job(session, alive_job.id, worker="alive", device="cpu")
    store.claim_job(session, dead_job.id, worker="gone", device="cpu")

    report = reconcile_once(session, redis, **RECONCILE)
    assert report.recovered == [dead_job.id] and report.failed == []
    session.expire_all()
    assert store.get_job(session, alive_job.id).status == "running"
    row = store.get_job(session, dead_job.id)
    assert (row.status, row.worker, row.attempts) == ("queued", None, 1)
    assert queue_of(redis, "normal") == [dead_job.id]

    # Its second run dies too: max_attempts=2 is used up, so it fails with the reason.
    redis.delete(RQJob.key_for(dead_job.id))
    store.claim_job(session, dead_job.id, worker="gone-again", device="cpu")
    report = reconcile_once(session, redis, **RECONCILE)
    assert report.failed == [dead_job.id]
    session.expire_all()
    row = store.get_job(session, dead_job.id)
    assert row.status == "failed" and "gave up after 2 attempts" in row.error


def test_a_dead_runs_started_entry_goes_and_a_live_ones_stays(session, redis):
    """RQ's started registry (what ``rq info`` lists as running) keeps a dead worker's entry
    until someone removes it; RQ's own cleanup never walks the tenants' queues."""
    alive_job, dead_job = store.insert_jobs(session, [make_job(), make_job()])
    enqueue_jobs(redis, [QueueEntry.of(alive_job), QueueEntry.of(dead_job)], timeout_s=60)
    origin = redis.hget(rq_job_key(dead_job.id), "origin").decode()
    _register_worker(redis, "alive")
    redis.zadd(rq_started_key(origin), {f"{alive_job.id}:e1": time.time() + 60, f"{dead_job.id}:e2": time.time() - 5})
    store.claim_job(session, alive_job.id, worker="alive", device="cpu")
    store.claim_job(session, dead_job.id, worker="gone", device="cpu")

    assert reconcile_once(session, redis, **RECONCILE).recovered == [dead_job.id]
    assert redis.zrange(rq_started_key(origin), 0, -1) == [f"{alive_job.id}:e1".encode()]


def test_a_worker_that_registered_its_death_counts_as_dead(session, redis):
    [job] = store.insert_jobs(session, [make_job()])
    _register_worker(redis, "stopped")
    redis.hset(Worker.redis_worker_namespace_prefix + "stopped", "death", utcnow().isoformat())
    store.claim_job(session, job.id, worker="stopped", device="cpu")
    assert reconcile_once(session, redis, **RECONCILE).recovered == [job.id]


def test_rows_created_before_the_cutoff_are_the_only_ones_considered(session):
    store.insert_jobs(session, [make_job()])
    assert store.queued_jobs_created_before(session, utcnow() - timedelta(minutes=1)) == []
    assert len(store.queued_jobs_created_before(session, utcnow() + timedelta(seconds=1))) == 1


def test_a_redis_that_restarted_empty_gets_a_settling_time_before_any_worker_is_judged_dead(session, redis):
    job = store.insert_jobs(session, [make_job()])[0]
    assert store.claim_job(session, job.id, worker="w-alive", device="cpu") is not None
    # Redis restarted empty: the worker's key is gone until its next heartbeat re-registers it.
    settling = RECONCILE | {"redis_settle_s": 30.0}
    assert reconcile_once(session, redis, **settling).recovered == []
    redis.set("gpuq:redis-epoch", time.time() - 31)  # a worker TTL later, still no key: dead
    assert reconcile_once(session, redis, **settling).recovered == [job.id]


def _started_in_redis(redis: Redis, job_id: str, *, worker: str) -> None:
    """RQ's hash of a job its worker has started (the start written, the claim not yet)."""
    redis.hset(
        RQJob.key_for(job_id),
        mapping={"status": "started", "origin": "gpuq:smollm2-135m:generate:normal", "worker_name": worker},
    )


def test_a_job_started_by_a_live_worker_that_never_claims_it_is_enqueued_again(session, redis):
    """Redis applied a worker's start of the job and went down before replying: the worker
    took the start as failed and forgot the job, whose hash says `started` by that live worker
    while SQL still has it queued. Seen once in the stacked soak: the job stayed queued for good."""
    [job] = store.insert_jobs(session, [make_job()])
    _register_worker(redis, "alive")
    _started_in_redis(redis, job.id, worker="alive")

    # The first pass takes it for a claim on its way (milliseconds, normally); a pass the
    # in-flight limit later, with still no claim, enqueues it again.
    assert reconcile_once(session, redis, **(RECONCILE | {"in_flight_limit_s": 0.5})).requeued == []
    time.sleep(0.6)
    assert reconcile_once(session, redis, **(RECONCILE | {"in_flight_limit_s": 0.5})).requeued == [job.id]
    assert queue_of(redis, "normal") == [job.id]

    # Claimed on its worker meanwhile: no longer queued in SQL, so never a suspect.
    [claimed] = store.insert_jobs(session, [make_job()])
    _started_in_redis(redis, claimed.id, worker="alive")
    store.claim_job(session, claimed.id, worker="alive", device="cpu")
    for _ in range(2):
        assert reconcile_once(session, redis, **(RECONCILE | {"in_flight_limit_s": 0.0})).requeued == []


def test_a_pass_rebuilds_the_fair_picks_state_redis_lost_from_sql(session, redis):
    """After Redis restarted empty: a tenant's lost job goes back to its tenant's queue, among
    its band's flows (so a worker's pick finds it), and the tenants' weights are SQL's again."""
    from gpuq.db.tables import Role
    from gpuq.jobs import fair
    from gpuq.queue_names import Priority, band_name
    from gpuq.redis_keys import FAIR_WEIGHTS_KEY

    store.create_api_key(session, name="batch", owner="research", role=Role.SUBMITTER, weight=4)
    [lost] = store.insert_jobs(session, [make_job(owner="research")])
    redis.hset(FAIR_WEIGHTS_KEY, "research", 1)  # stale

    assert reconcile_once(session, redis, **RECONCILE).requeued == [lost.id]

    assert queue_of(redis, "normal:research") == [lost.id]
    assert redis.hgetall(FAIR_WEIGHTS_KEY) == {b"research": b"4"}
    band = band_name("smollm2-135m", "generate", Priority.NORMAL)
    assert fair.Picker(redis, [band]).take() == (f"{band}:research", lost.id)
