"""Every run of a job is recorded with how it ended, a refunded rerun included, on both databases."""

from datetime import timedelta

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from gpuq.store.retention import delete_finished_jobs
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job


def _runs(session, job_id):
    session.expire_all()
    return [(r.attempt, r.worker, r.outcome, r.refunded) for r in store.runs_of_job(session, job_id)]


@both_databases
def test_a_job_that_died_beside_others_and_ran_again_shows_both_runs_though_attempts_says_1(session):
    [job] = store.insert_jobs(session, [make_job()])
    store.claim_job(session, job.id, worker="w1", device="cpu", host="h1")
    assert _runs(session, job.id) == [(1, "w1", None, False)]  # running: no end yet
    died = "worker w1 died with 3 jobs running; not charged, run alone next"
    assert store.return_to_queue(session, job.id, worker="w1", reason=died, refund_attempt=True)
    second = store.claim_job(session, job.id, worker="w2", device="cpu", host="h2")
    outcome = store.Outcome(job.id, "w2", JobStatus.SUCCEEDED, utcnow(), result={"text": "ok"}, run_id=second.run_id)
    assert store.record_outcomes(session, [outcome]) == 1

    session.expire_all()
    assert store.get_job(session, job.id).attempts == second.attempts == 1
    assert _runs(session, job.id) == [(1, "w1", "requeued", True), (1, "w2", "succeeded", False)]
    first, last = store.runs_of_job(session, job.id)
    assert first.reason == died and first.host == "h1" and first.ended_at is not None
    assert last.reason is None and last.ended_at == outcome.finished_at


@both_databases
def test_a_stale_outcome_ends_no_run_and_a_failure_keeps_its_error(session):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    assert store.return_to_queue(session, job.id, worker="w1", reason="worker w1 died while running it")
    second = store.claim_job(session, job.id, worker="w1", device="cpu")  # the same worker takes it back
    stale = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), run_id=first.run_id)
    assert store.record_outcomes(session, [stale]) == 0
    assert _runs(session, job.id) == [(1, "w1", "requeued", False), (2, "w1", None, False)]
    failed = store.Outcome(job.id, "w1", JobStatus.FAILED, utcnow(), error="ValueError: bad", run_id=second.run_id)
    assert store.record_outcomes(session, [failed]) == 1
    assert _runs(session, job.id)[-1] == (2, "w1", "failed", False)
    assert store.runs_of_job(session, job.id)[-1].reason == "ValueError: bad"


@both_databases
def test_a_job_given_up_on_or_requeued_by_an_admin_ends_its_run_so(session):
    a, b = store.insert_jobs(session, [make_job(), make_job()])
    for job in (a, b):
        store.claim_job(session, job.id, worker="w1", device="cpu")
    assert store.fail_abandoned_job(session, a.id, worker="w1", error="gave up after 3 attempts")
    assert store.requeue_running_job(session, b.id, worker="w1")
    assert _runs(session, a.id) == [(1, "w1", "failed", False)]
    assert store.runs_of_job(session, a.id)[0].reason == "gave up after 3 attempts"
    assert _runs(session, b.id) == [(1, "w1", "requeued", False)]
    assert store.runs_of_job(session, b.id)[0].reason == "requeued by an admin"


@both_databases
def test_pruning_a_finished_job_takes_its_runs_and_leaves_others(session):
    old, kept = store.insert_jobs(session, [make_job(), make_job()])
    runs = [store.claim_job(session, job.id, worker="w1", device="cpu").run_id for job in (old, kept)]
    long_ago = utcnow() - timedelta(days=40)
    done = store.Outcome(old.id, "w1", JobStatus.SUCCEEDED, long_ago, run_id=runs[0])
    assert store.record_outcomes(session, [done]) == 1
    assert delete_finished_jobs(session, before=utcnow() - timedelta(days=30), limit=100) == 1
    session.expire_all()
    assert store.runs_of_job(session, old.id) == []
    assert _runs(session, kept.id) == [(1, "w1", None, False)]
