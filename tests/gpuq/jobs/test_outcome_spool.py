"""Outcomes spooled to Redis keep the attempt that produced them, so a spool applied late
cannot overwrite a later run of the job."""

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from gpuq.jobs.outcome_spool import apply_spool, spool
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job


@both_databases
def test_a_spooled_outcome_of_an_earlier_attempt_is_not_applied_to_a_later_run(session, redis):
    [job] = store.insert_jobs(session, [make_job()])
    store.claim_job(session, job.id, worker="w1", device="cpu")
    stale = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "stale"}, attempt=1)
    spool(redis, "w1", [(stale, None)])
    store.return_to_queue(session, job.id, worker="w1", reason="its worker died")
    store.claim_job(session, job.id, worker="w1", device="cpu")  # attempt 2, same worker
    assert apply_spool(session, redis, "w1") == []
    session.expire_all()
    assert store.get_job(session, job.id).status == "running"
