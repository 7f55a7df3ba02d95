"""Conditional state changes decide races in the database, on SQLite and PostgreSQL alike."""

from datetime import timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from tests.conftest import both_databases


def make_job(**overrides):
    fields = {
        "id": store.new_job_id(),
        "kind": "generate",
        "model": "smollm2-135m",
        "priority": 1,
        "request": {"prompt": "hi", "max_tokens": 4},
        "request_hash": "h",
    }
    return store.NewJob(**(fields | overrides))


@both_databases
def test_only_one_worker_can_claim_a_job(session):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    second = store.claim_job(session, job.id, worker="w2", device="cpu")
    assert first is not None and first.attempts == 1 and first.request["prompt"] == "hi"
    assert second is None
    row = store.get_job(session, job.id)
    assert (row.status, row.worker, row.attempts) == ("running", "w1", 1)


@both_databases
def test_a_cancelled_job_cannot_be_claimed_and_a_claimed_job_cannot_be_cancelled_as_queued(session):
    a, b = store.insert_jobs(session, [make_job(), make_job()])
    assert store.cancel_queued_job(session, a.id)
    assert store.claim_job(session, a.id, worker="w", device="cpu") is None
    assert store.claim_job(session, b.id, worker="w", device="cpu") is not None
    assert not store.cancel_queued_job(session, b.id)
    assert store.mark_cancel_requested(session, b.id)
    session.expire_all()
    assert store.get_job(session, a.id).status == "cancelled"
    assert store.get_job(session, b.id).cancel_requested_at is not None


@both_databases
def test_outcomes_are_written_only_for_the_worker_that_holds_the_job(session):
    [job] = store.insert_jobs(session, [make_job()])
    store.claim_job(session, job.id, worker="w1", device="cpu")
    stale = store.Outcome(job.id, "w0", JobStatus.SUCCEEDED, utcnow(), result={"text": "stale"})
    fresh = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "ok"}, completion_tokens=3)
    assert store.record_outcomes(session, [stale]) == 0
    assert store.record_outcomes(session, [fresh]) == 1
    session.expire_all()
    row = store.get_job(session, job.id)
    assert (row.status, row.result, row.completion_tokens) == ("succeeded", {"text": "ok"}, 3)


@both_databases
def test_an_outcome_of_an_earlier_run_never_overwrites_a_later_run_on_the_same_worker(session):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    assert store.return_to_queue(
        session, job.id, worker="w1", reason="its worker died"
    )  # the reconciler queued it again
    second = store.claim_job(session, job.id, worker="w1", device="cpu")  # and w1 took it back
    assert (first.attempts, second.attempts) == (1, 2)
    stale = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "stale"}, run_id=first.run_id)
    fresh = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "ok"}, run_id=second.run_id)
    assert store.record_outcomes(session, [stale]) == 0
    session.expire_all()
    assert store.get_job(session, job.id).status == "running"
    assert store.record_outcomes(session, [fresh]) == 1
    session.expire_all()
    row = store.get_job(session, job.id)
    assert (row.status, row.result, row.attempts) == ("succeeded", {"text": "ok"}, 2)


@both_databases
def test_an_idempotency_key_can_be_stored_once_and_is_found_only_by_its_tenant(session):
    store.insert_jobs(session, [make_job(idempotency_key="k1", owner="acme")])
    with pytest.raises(IntegrityError):
        store.insert_jobs(session, [make_job(idempotency_key="k1", owner="acme")])
    session.rollback()
    assert list(store.jobs_by_idempotency_keys(session, ["k1", "k2"], "acme")) == ["k1"]
    assert store.jobs_by_idempotency_keys(session, ["k1"], "globex") == {}


@both_databases
def test_list_jobs_filters_and_pages_newest_first(session):
    jobs = [make_job(kind="embed" if i % 2 else "generate", priority=i % 3) for i in range(7)]
    for job in jobs:  # separate inserts: distinct creation times
        store.insert_jobs(session, [job])
    page1, more = store.list_jobs(session, store.JobFilter(), limit=3)
    assert more and [j.id for j in page1] == [j.id for j in reversed(jobs)][:3]
    page2, _ = store.list_jobs(session, store.JobFilter(), limit=3, after=page1[-1].id)
    assert [j.id for j in page2] == [j.id for j in reversed(jobs)][3:6]
    embeds, _ = store.list_jobs(session, store.JobFilter(kind="embed"), limit=10)
    assert {j.id for j in embeds} == {j.id for j in jobs if j.kind == "embed"}
    high, _ = store.list_jobs(session, store.JobFilter(priority=0, statuses=("queued",)), limit=10)
    assert {j.id for j in high} == {j.id for j in jobs if j.priority == 0}
    future, _ = store.list_jobs(session, store.JobFilter(created_after=utcnow() + timedelta(hours=1)), limit=10)
    assert future == []
    with pytest.raises(LookupError):
        store.list_jobs(session, store.JobFilter(), limit=3, after="job_missing")


@both_databases
def test_an_outcome_of_an_earlier_run_is_discarded_though_a_refund_made_the_attempts_equal(session):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    # It died beside others: back to the queue, its attempt refunded; the same worker takes it back
    assert store.return_to_queue(session, job.id, worker="w1", reason="died beside others", refund_attempt=True)
    second = store.claim_job(session, job.id, worker="w1", device="cpu")
    assert first.attempts == second.attempts == 1 and first.run_id != second.run_id
    stale = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "stale"}, run_id=first.run_id)
    assert store.record_outcomes(session, [stale]) == 0
    session.expire_all()
    assert store.get_job(session, job.id).status == "running"
    assert [r.ended_at is None for r in store.runs_of_job(session, job.id)] == [False, True]  # the later run goes on
    fresh = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "ok"}, run_id=second.run_id)
    assert store.record_outcomes(session, [fresh]) == 1
    session.expire_all()
    assert store.get_job(session, job.id).result == {"text": "ok"}
    assert [r.outcome for r in store.runs_of_job(session, job.id)] == ["requeued", "succeeded"]


@both_databases
def test_an_outcome_of_a_run_an_admin_requeued_is_discarded_once_the_same_worker_runs_it_again(session):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    assert store.requeue_running_job(session, job.id, worker="w1")  # attempts stay counted
    second = store.claim_job(session, job.id, worker="w1", device="cpu")
    stale = store.Outcome(job.id, "w1", JobStatus.CANCELLED, utcnow(), run_id=first.run_id)
    assert store.record_outcomes(session, [stale]) == 0
    session.expire_all()
    assert store.get_job(session, job.id).status == "running"
    assert store.claimed_by(session, job.id, worker="w1").run_id == second.run_id
