"""Outcomes spooled to Redis keep the attempt that produced them, so a spool applied late
cannot overwrite a later run of the job; outcomes spooled to files (Redis down too) are
written for workers that died, never for live ones."""

from rq import Queue
from rq.worker import Worker

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from gpuq.jobs.outcome_spool import apply_file_spools, apply_spool, spool, spool_dir, spool_to_file
from gpuq.stats.metrics import FinishedJob
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job


@both_databases
def test_a_spooled_outcome_of_an_earlier_run_is_not_applied_to_a_later_run(session, redis):
    [job] = store.insert_jobs(session, [make_job()])
    first = store.claim_job(session, job.id, worker="w1", device="cpu")
    stale = store.Outcome(job.id, "w1", JobStatus.SUCCEEDED, utcnow(), result={"text": "stale"}, run_id=first.run_id)
    spool(redis, "w1", [(stale, None)])
    store.return_to_queue(session, job.id, worker="w1", reason="its worker died")
    store.claim_job(session, job.id, worker="w1", device="cpu")  # attempt 2, same worker
    assert apply_spool(session, redis, "w1") == []
    session.expire_all()
    assert store.get_job(session, job.id).status == "running"


@both_databases
def test_outcomes_spooled_to_files_are_written_for_dead_workers_and_left_to_live_ones(session, redis, tmp_path):
    dead_job, live_job = store.insert_jobs(session, [make_job(), make_job()])
    runs = {
        job.id: store.claim_job(session, job.id, worker=worker, device="cpu").run_id
        for job, worker in ((dead_job, "w-dead"), (live_job, "w-live"))
    }
    Worker(
        [Queue("gpuq:smollm2-135m:generate:high", connection=redis)], connection=redis, name="w-live"
    ).register_birth()
    spools = spool_dir(tmp_path)
    finished = FinishedJob(model="smollm2-135m", kind="generate", status="succeeded")
    for job, worker in ((dead_job, "w-dead"), (live_job, "w-live")):
        outcome = store.Outcome(job.id, worker, JobStatus.SUCCEEDED, utcnow(), result={}, run_id=runs[job.id])
        spool_to_file(spools, [(outcome, finished)])

    assert apply_file_spools(session, redis, spools) == [dead_job.id]
    session.expire_all()
    assert store.get_job(session, dead_job.id).status == "succeeded"
    assert store.get_job(session, live_job.id).status == "running"  # its own worker writes it
    [left] = list(spools.iterdir())
    assert b"w-live" in left.read_bytes() and left.stat().st_mode & 0o777 == 0o600
    assert apply_file_spools(session, redis, spools / "absent") == []
