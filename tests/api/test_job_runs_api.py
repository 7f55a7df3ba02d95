"""GET /v1/jobs/{id} shows every run of a job: a rerun is visible although attempts says 1."""

from datetime import datetime

from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from tests.conftest import both_databases


@both_databases
def test_a_job_rerun_after_dying_beside_others_shows_both_runs(client, session):
    job = client.post("/v1/jobs", json={"kind": "noop", "model": "smollm2-135m"}).json()
    assert client.get(f"/v1/jobs/{job['id']}").json()["runs"] == []  # queued: never run

    store.claim_job(session, job["id"], worker="w1", device="cpu", host="h1")
    running = client.get(f"/v1/jobs/{job['id']}").json()["runs"]
    assert [(r["worker"], r["outcome"], r["ended_at"]) for r in running] == [("w1", None, None)]
    died = "worker w1 died with 2 jobs running; not charged, run alone next"
    store.return_to_queue(session, job["id"], worker="w1", reason=died, refund_attempt=True)
    second = store.claim_job(session, job["id"], worker="w2", device="cpu", host="h2")
    store.record_outcomes(
        session, [store.Outcome(job["id"], "w2", JobStatus.SUCCEEDED, utcnow(), result={}, run_id=second.run_id)]
    )

    shown = client.get(f"/v1/jobs/{job['id']}").json()
    assert shown["status"] == "succeeded" and shown["attempts"] == 1
    runs = shown["runs"]
    assert [(r["attempt"], r["worker"], r["host"], r["outcome"], r["refunded"]) for r in runs] == [
        (1, "w1", "h1", "requeued", True),
        (1, "w2", "h2", "succeeded", False),
    ]
    assert runs[0]["reason"] == died
    assert datetime.fromisoformat(runs[0]["ended_at"]) <= datetime.fromisoformat(runs[1]["started_at"])


def test_the_openapi_document_declares_the_runs(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "runs" in schemas["JobPublic"]["properties"]
    assert set(schemas["JobRunPublic"]["required"]) >= {"attempt", "worker", "started_at", "outcome", "refunded"}
