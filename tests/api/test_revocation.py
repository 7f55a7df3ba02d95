"""Revoking a key (issue 24 item 10): it stops new requests at once; with `cancel_jobs` it
also cancels every queued or running job it submitted, and so ends its open streams."""

import json
import threading

from sqlalchemy import update

from gpuq.db.tables import ApiKey, Job, utcnow
from gpuq.redis_keys import cancel_flag_key
from tests.api.conftest import bearer, redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


def key_id(client, secret: str) -> str:
    return str(client.get("/v1/keys/me", headers=bearer(secret)).json()["id"])


def statuses(session, ids) -> dict[str, str]:
    session.expire_all()
    return {j.id: j.status for j in session.query(Job).filter(Job.id.in_(ids))}


def start_batch(client, secret: str) -> list[str]:
    """A two-line batch of the key's; the ids of its jobs."""
    lines = [
        {"custom_id": c, "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": c}}
        for c in ("a", "b")
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file = client.post(
        "/v1/files", files={"file": ("in.jsonl", body)}, data={"purpose": "batch"}, headers=bearer(secret)
    ).json()
    batch = client.post(
        "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"}, headers=bearer(secret)
    ).json()
    return [j["id"] for j in client.get("/v1/jobs", params={"batch_id": batch["id"]}).json()["data"]]


@both_databases
def test_a_revoked_key_is_refused_at_once_and_its_queued_work_runs_on(client, make_key, session, redis):
    """What OpenAI and most APIs do: a revocation stops new requests, not accepted work."""
    leaked = make_key("submitter", "acme")
    job = client.post("/v1/jobs", json=NOOP, headers=bearer(leaked)).json()
    assert client.delete(f"/v1/keys/{key_id(client, leaked)}").status_code == 204
    refused = client.post("/v1/jobs", json=NOOP, headers=bearer(leaked))
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert statuses(session, [job["id"]]) == {job["id"]: "queued"}
    assert len(redis_job_keys(redis)) == 1


@both_databases
def test_revoking_with_cancel_jobs_cancels_every_queued_and_running_job_of_the_key(client, make_key, session, redis):
    leaked, colleague = make_key("submitter", "acme"), make_key("submitter", "acme")
    queued = [client.post("/v1/jobs", json=NOOP, headers=bearer(leaked)).json()["id"] for _ in range(3)]
    of_batch = start_batch(client, leaked)
    running = client.post("/v1/jobs", json=NOOP, headers=bearer(leaked)).json()["id"]
    session.execute(update(Job).where(Job.id == running).values(status="running", worker="w1", started_at=utcnow()))
    session.commit()
    kept = client.post("/v1/jobs", json=NOOP, headers=bearer(colleague)).json()["id"]  # same tenant, other key

    answer = client.delete(f"/v1/keys/{key_id(client, leaked)}", params={"cancel_jobs": "true"})
    assert answer.status_code == 204
    assert client.get("/v1/jobs", headers=bearer(leaked)).status_code == 401
    after = statuses(session, [*queued, *of_batch, running, kept])
    assert {after[i] for i in [*queued, *of_batch]} == {"cancelled"}
    assert after[running] == "running" and after[kept] == "queued"
    # the running job's worker is told to stop it at its next token, as a single cancel does
    assert redis.exists(cancel_flag_key(running)) == 1
    assert session.get(Job, running).cancel_requested_at is not None
    waiting = {x.decode() for q in redis.keys("rq:queue:*") for x in redis.lrange(q, 0, -1)}
    assert waiting - {running} == {kept}  # (`running` was made so by hand, still listed)


@both_databases
def test_cancel_jobs_works_on_a_key_revoked_earlier_and_not_on_an_unknown_or_last_admin_key(client, make_key, session):
    leaked = make_key("submitter", "acme")
    job = client.post("/v1/jobs", json=NOOP, headers=bearer(leaked)).json()["id"]
    leaked_id = key_id(client, leaked)
    assert client.delete(f"/v1/keys/{leaked_id}").status_code == 204
    assert client.delete(f"/v1/keys/{leaked_id}").status_code == 404  # revoked already: nothing to do
    assert client.delete(f"/v1/keys/{leaked_id}", params={"cancel_jobs": "true"}).status_code == 204
    assert statuses(session, [job]) == {job: "cancelled"}

    unknown = client.delete("/v1/keys/key_nope", params={"cancel_jobs": "true"})
    assert unknown.status_code == 404 and "does not exist" in unknown.json()["detail"]
    mine = client.post("/v1/jobs", json=NOOP).json()["id"]  # the admin's own job
    [me] = [k["id"] for k in client.get("/v1/keys").json()["data"] if k["role"] == "admin"]
    assert client.delete(f"/v1/keys/{me}", params={"cancel_jobs": "true"}).status_code == 409
    assert statuses(session, [mine]) == {mine: "queued"}


@both_databases
def test_a_submission_that_authenticated_before_the_revocation_commits_nothing_after_it(
    settings, make_key, session, redis, job_rows
):
    """The race the key's row decides: a request that passed authentication but is
    admitted after the revocation committed is refused, so a cancel finds every job."""
    import anyio

    from gpuq.auth.access import Caller
    from gpuq.db.engine import async_engine, async_sessions
    from gpuq.db.tables import JobKind
    from gpuq.errors import RequestError
    from gpuq.jobs.request import JobParams
    from gpuq.jobs.submit import JobSpec, submit_jobs
    from gpuq.queue_names import Priority

    leaked = make_key("submitter", "acme")
    row = session.query(ApiKey).filter(ApiKey.key_prefix == leaked[:12]).one()
    caller = Caller.of(row)  # authenticated while the key was active
    row.revoked_at = utcnow()
    session.commit()
    spec = JobSpec(kind=JobKind.NOOP, model=MODEL, priority=Priority.HIGH, params=JobParams())

    async def submit() -> int:
        engine = async_engine(settings.database_url)
        try:
            async with async_sessions(engine)() as db:
                await submit_jobs(db, redis, [spec], timeout_s=60, caller=caller, worker_slots=0)
                return 202
        except RequestError as exc:
            return exc.status
        finally:
            await engine.dispose()

    assert anyio.run(submit) == 401
    assert job_rows() == [] and redis_job_keys(redis) == []


@both_databases
def test_revoking_with_cancel_jobs_ends_the_keys_open_stream(settings, make_key, admin_key):
    """A streamed call waiting on its queued job (no worker runs here) ends, with OpenAI's
    error event, once its key is revoked with `cancel_jobs`."""
    from fastapi.testclient import TestClient

    from api.main import create_app

    leaked = make_key("submitter", "acme")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    lines: list[str] = []
    with TestClient(create_app(settings)) as client:
        opened = threading.Event()

        def call() -> None:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=bearer(leaked)) as answer:
                assert answer.status_code == 200
                opened.set()
                lines.extend(answer.iter_lines())

        caller = threading.Thread(target=call)
        caller.start()
        assert opened.wait(30)
        leaked_id = client.get("/v1/keys/me", headers=bearer(leaked)).json()["id"]
        revoked = client.delete(f"/v1/keys/{leaked_id}", params={"cancel_jobs": "true"}, headers=bearer(admin_key))
        assert revoked.status_code == 204
        caller.join(30)
        assert not caller.is_alive(), "the revoked key's stream is still open"
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events and "cancelled" in events[-1]["error"]["message"]
