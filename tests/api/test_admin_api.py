"""Retry, requeue and bulk actions, and the workers' view, over HTTP against real SQL and
Redis (no worker: the rows and worker hashes are put in the states a worker would leave them in)."""

from datetime import UTC, datetime, timedelta

import pytest
from rq.worker import Worker
from sqlalchemy import update

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Batch, Job
from gpuq.jobs import actions as job_actions
from gpuq.redis_keys import GPUS_FIELD, HOST_FIELD, SLOT_FIELD, SLOTS_BUSY_FIELD, SLOTS_FIELD, rq_worker_key
from tests.api.conftest import bearer, queued_ids
from tests.conftest import both_databases

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


@pytest.fixture
def set_rows(database_url):
    """Sets columns of job rows (the end a worker would have recorded)."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)

    def set_(ids, **values):
        with sessions() as s:
            s.execute(update(Job).where(Job.id.in_(ids)).values(**values))
            s.commit()

    yield set_, sessions
    engine.dispose()


def _submit(client, n=1, **fields):
    return [client.post("/v1/jobs", json=NOOP | fields).json()["id"] for _ in range(n)]


def _fail(set_rows, ids):
    set_rows[0](ids, status="failed", error="boom", finished_at=datetime.now(UTC), attempts=1, worker="w1")


@both_databases
def test_retry_queues_a_failed_job_again_as_a_fresh_run(client, redis, set_rows):
    [job_id] = _submit(client)
    redis.flushdb()  # the worker took it (and RQ's hash is gone after the run)
    _fail(set_rows, [job_id])
    response = client.post(f"/v1/jobs/{job_id}/retry")
    assert response.status_code == 202
    job = response.json()
    assert (job["status"], job["error"], job["finished_at"], job["worker"]) == ("queued", None, None, None)
    assert job["attempts"] == 1  # kept
    assert queued_ids(redis, f"gpuq:{MODEL}:noop:normal:admin") == [job_id]

    again = client.post(f"/v1/jobs/{job_id}/retry")
    assert again.status_code == 409 and "already queued" in again.json()["detail"]
    assert queued_ids(redis, f"gpuq:{MODEL}:noop:normal:admin") == [job_id]  # no second entry


def test_a_batch_job_may_be_retried_while_its_batch_runs_not_once_it_is_finalised(client, redis, set_rows):
    [job_id] = _submit(client)
    _fail(set_rows, [job_id])
    set_rows[0]([job_id], batch_id="batch_x")
    now = datetime.now(UTC)
    with set_rows[1]() as s:
        s.add(
            Batch(
                id="batch_x",
                endpoint="/v1/embeddings",
                input_file_id="file_x",
                completion_window="24h",
                status="completed",
                priority=2,
                total=1,
                expires_at=now + timedelta(hours=24),
            )
        )
        s.commit()
    closed = client.post(f"/v1/jobs/{job_id}/retry")
    assert closed.status_code == 409 and "batch_x, which is completed" in closed.json()["detail"]
    assert client.post("/v1/jobs/retry", json={"status": ["failed"]}).json() == {"matched": 1, "changed": 0}
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "failed"

    with set_rows[1]() as s:
        s.execute(update(Batch).values(status="in_progress"))
        s.commit()
    assert client.post(f"/v1/jobs/{job_id}/retry").status_code == 202


@both_databases
def test_bulk_cancel_touches_exactly_the_jobs_the_filter_selects(client, redis):
    low = _submit(client, 2, priority="low")
    normal = _submit(client, 2)
    result = client.post("/v1/jobs/cancel", json={"priority": "low"})
    assert result.status_code == 200 and result.json() == {"matched": 2, "changed": 2}
    assert [client.get(f"/v1/jobs/{i}").json()["status"] for i in low + normal] == ["cancelled"] * 2 + ["queued"] * 2
    assert queued_ids(redis, f"gpuq:{MODEL}:noop:low:admin") == []
    assert queued_ids(redis, f"gpuq:{MODEL}:noop:normal:admin") == normal
    # Cancelled jobs match no more.
    assert client.post("/v1/jobs/cancel", json={"priority": "low"}).json() == {"matched": 0, "changed": 0}


def test_a_submitters_bulk_action_touches_only_its_own_tenants_jobs(client, make_key, redis):
    acme, globex = bearer(make_key("submitter", "acme")), bearer(make_key("submitter", "globex"))
    mine = [client.post("/v1/jobs", json=NOOP, headers=acme).json()["id"] for _ in range(2)]
    theirs = client.post("/v1/jobs", json=NOOP, headers=globex).json()["id"]
    assert client.post("/v1/jobs/cancel", json={"status": ["queued"]}, headers=acme).json() == {
        "matched": 2,
        "changed": 2,
    }
    assert client.get(f"/v1/jobs/{theirs}").json()["status"] == "queued"
    assert {client.get(f"/v1/jobs/{i}").json()["status"] for i in mine} == {"cancelled"}
    assert client.post(f"/v1/jobs/{mine[0]}/retry", headers=acme).status_code == 202  # owners may retry
    assert client.post(f"/v1/jobs/{mine[1]}/retry", headers=globex).status_code == 404
    assert client.post(f"/v1/jobs/{mine[1]}/requeue", headers=acme).status_code == 403


def test_a_bulk_action_over_the_cap_is_refused_and_changes_nothing(client, redis, monkeypatch):
    monkeypatch.setattr(job_actions, "MAX_BULK_JOBS", 2)
    ids = _submit(client, 3)
    refused = client.post("/v1/jobs/cancel", json={"model": MODEL})
    assert refused.status_code == 422 and "3 jobs match; one call changes at most 2" in refused.json()["detail"]
    assert {client.get(f"/v1/jobs/{i}").json()["status"] for i in ids} == {"queued"}
    assert queued_ids(redis, f"gpuq:{MODEL}:noop:normal:admin") == ids


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/jobs/retry", {}, "give at least one filter"),
        ("/v1/jobs/retry", {"status": ["succeeded"]}, "only failed or cancelled jobs can be retried"),
        ("/v1/jobs/cancel", {"status": ["failed"]}, "only queued or running jobs can be cancelled"),
        ("/v1/jobs/cancel", {"priority": "urgent"}, "unknown priority"),
        ("/v1/jobs/cancel", {"created_after": "2026-01-01T00:00:00"}, "needs a time zone"),
        ("/v1/jobs/cancel", {"models": [MODEL]}, "models"),
    ],
)
def test_a_bad_filter_is_a_clear_422_and_changes_nothing(client, redis, path, body, words):
    ids = _submit(client, 1)
    response = client.post(path, json=body)
    assert response.status_code == 422 and words in response.json()["detail"]
    assert client.get(f"/v1/jobs/{ids[0]}").json()["status"] == "queued"


def test_requeue_refuses_finished_jobs_and_names_the_way_forward(client, redis, set_rows):
    failed, succeeded = _submit(client, 2)
    _fail(set_rows, [failed])
    set_rows[0]([succeeded], status="succeeded")
    hint = client.post(f"/v1/jobs/{failed}/requeue")
    assert hint.status_code == 409 and "use retry" in hint.json()["detail"]
    assert client.post(f"/v1/jobs/{succeeded}/requeue").status_code == 409
    assert client.post("/v1/jobs/job_missing/requeue").status_code == 404


def test_worker_and_model_actions_on_unknown_names_are_404s(client, redis):
    assert client.get("/v1/workers").json() == {"data": [], "drained_hosts": []}
    for path, body in (
        ("/v1/workers/ghost/drain", None),
        ("/v1/workers/ghost/undrain", None),
        ("/v1/workers/ghost/unload", {"model": MODEL}),
        ("/v1/hosts/nowhere/drain", None),
        ("/v1/models/missing/unload", None),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 404, path
    assert redis.keys("gpuq:drained-hosts") == []


def _register_worker(redis, name, **fields):
    """A live worker as RQ and gpuq's worker leave it in Redis: its hash and its registry entry."""
    redis.hset(rq_worker_key(name), mapping={"state": "idle", HOST_FIELD: "node1"} | fields)
    redis.sadd(Worker.redis_workers_keys, rq_worker_key(name))


def test_workers_show_their_slots_and_every_job_running_on_them(client, redis, set_rows):
    batching, busy_in_redis, older = "node1.gpu0.11.ab", "node1.gpu1.12.cd", "node1.cpu.13.ef"
    gpu = {SLOT_FIELD: "gpu0", GPUS_FIELD: "GPU-0", SLOTS_FIELD: 4}
    _register_worker(redis, batching, state="busy", **gpu, **{SLOTS_BUSY_FIELD: 2})
    # Its hash says a job started; SQL does not record it yet: busy all the same.
    _register_worker(redis, busy_in_redis, **{SLOT_FIELD: "gpu1", SLOTS_FIELD: 4, SLOTS_BUSY_FIELD: 1})
    _register_worker(redis, older, **{SLOT_FIELD: "cpu"})  # from before slots: publishes neither field
    ids = _submit(client, 3)
    set_rows[0](ids[:2], status="running", worker=batching, started_at=datetime.now(UTC))
    views = {w["name"]: w for w in client.get("/v1/workers").json()["data"]}

    shown = views[batching]
    assert (shown["state"], shown["slots"], shown["slots_busy"]) == ("busy", 4, 2)
    assert shown["running_jobs"] == sorted(ids[:2])  # by submission
    assert shown["current_job"] == shown["running_jobs"][0]  # the first, for older clients
    assert (views[busy_in_redis]["state"], views[busy_in_redis]["running_jobs"]) == ("busy", [])
    assert (views[older]["slots"], views[older]["slots_busy"], views[older]["state"]) == (1, 0, "idle")
    assert views[older]["current_job"] is None
    assert client.get(f"/v1/workers/{batching}").json()["running_jobs"] == shown["running_jobs"]
    drained = client.post(f"/v1/workers/{batching}/drain").json()
    assert (drained["state"], drained["slots_busy"]) == ("draining", 2)
