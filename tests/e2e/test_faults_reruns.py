"""A rerun is visible: jobs that die together with their worker (SIGKILL, three sequences
live) run again uncharged, so ``attempts`` still says 1, and their run history in SQL (and
GET /v1/jobs/{id}) shows both runs, the first one refunded. Both databases."""

import time

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from tests.conftest import both_databases
from tests.e2e.conftest import reconcile, wait_until

MODEL = "smollm2-135m"
COUNTING = {"kind": "generate", "model": MODEL, "prompt": "Count: 1, 2, 3,", "temperature": 0, "max_tokens": 150}


def _history(database_url: str, job_ids: list[str]) -> dict[str, tuple[str, int, list[tuple]]]:
    """Each job's status, attempts and runs (worker, attempt, outcome, refunded), as SQL has them."""
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            found = {}
            for job_id in job_ids:
                job = store.get_job(session, job_id)
                assert job is not None
                runs = [(r.worker, r.attempt, r.outcome, r.refunded) for r in store.runs_of_job(session, job_id)]
                found[job_id] = (job.status, job.attempts, runs)
            return found
    finally:
        engine.dispose()


@both_databases
def test_jobs_rerun_after_dying_beside_others_show_both_runs_though_attempts_says_1(processes):
    processes.settings |= {
        "GPUQ_WORKER_SLOTS": "3",
        "GPUQ_WORKER_TTL_S": "2",
        "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    }
    _api, url = processes.start_api()
    doomed, doomed_name = processes.start_worker()
    with processes.client(url) as client:
        ids = [j["id"] for j in client.submit_many([COUNTING] * 3)]
        wait_until(lambda: all(client.job(i)["status"] == "running" for i in ids), "the three never ran together")
        doomed.kill()  # SIGKILL: all three go down with their worker
        recovered: list[str] = []
        deadline = time.monotonic() + 30
        while len(recovered) < 3 and time.monotonic() < deadline:
            recovered += reconcile(processes).recovered  # once the dead worker's key expired
            time.sleep(0.5)
        assert sorted(recovered) == sorted(ids)
        _survivor, survivor_name = processes.start_worker()
        shown = [client.wait(i, timeout_s=180) for i in ids]

    history = _history(processes.database_url, ids)
    for job_id in ids:
        assert history[job_id] == (
            "succeeded",
            1,
            [(doomed_name, 1, "requeued", True), (survivor_name, 1, "succeeded", False)],
        )
    for job in shown:  # the API shows the same history (client.wait reads GET /v1/jobs/{id})
        assert [(r["worker"], r["outcome"], r["refunded"]) for r in job["runs"]] == [
            (doomed_name, "requeued", True),
            (survivor_name, "succeeded", False),
        ]
        assert "died with 3 jobs running" in job["runs"][0]["reason"]
