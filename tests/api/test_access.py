"""API keys, roles and tenants: who may call what, and what each tenant sees."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import ApiKey, Job, utcnow
from tests.api.conftest import bearer, redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


@pytest.fixture
def as_key(client: TestClient):
    """Sends one request with another key than the client's admin key."""

    def send(key: str, method: str, path: str, **kwargs):
        return client.request(method, path, headers=bearer(key), **kwargs)

    return send


def batch_file(client, key):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "hi"}}
    return client.post(
        "/v1/files",
        files={"file": ("in.jsonl", (json.dumps(line) + "\n").encode())},
        data={"purpose": "batch"},
        headers=bearer(key),
    )


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "needs an API key"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "needs an API key"),
        ({"Authorization": "Bearer gpuq_not-a-key"}, "not valid"),
    ],
)
def test_a_request_without_a_valid_key_is_a_401_and_queues_nothing(settings, redis, headers, message, job_rows):
    from api.main import create_app

    with TestClient(create_app(settings)) as anonymous:
        response = anonymous.post("/v1/jobs", json=NOOP, headers=headers)
        assert anonymous.get("/healthz").status_code == 200  # health checks stay open
    assert response.status_code == 401 and message in response.json()["detail"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert job_rows() == [] and redis_job_keys(redis) == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/gpus", None),
        ("GET", "/v1/affinity-rules", None),
        ("POST", "/v1/affinity-rules", {"model_pattern": "*", "effect": "deny"}),
        ("GET", "/v1/schedules", None),
        ("GET", "/v1/keys", None),
        ("POST", "/v1/keys", {"name": "mine", "owner": "acme", "role": "admin"}),
        ("POST", "/v1/models", {"name": "x", "path": "x.gguf"}),
    ],
)
def test_a_submitter_on_an_admin_endpoint_is_a_403(as_key, make_key, method, path, body, session):
    submitter = make_key("submitter", "acme")
    response = as_key(submitter, method, path, json=body)
    assert response.status_code == 403 and "needs an admin key" in response.json()["detail"]
    assert session.query(ApiKey).count() == 2  # the admin's and the submitter's: no key was made


@both_databases
def test_tenants_see_only_their_own_jobs_and_another_tenants_job_is_a_404(as_key, make_key, client):
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")
    mine = as_key(acme, "POST", "/v1/jobs", json=NOOP).json()
    theirs = as_key(globex, "POST", "/v1/jobs", json=NOOP).json()
    assert (mine["owner"], theirs["owner"]) == ("acme", "globex")

    assert [j["id"] for j in as_key(acme, "GET", "/v1/jobs").json()["data"]] == [mine["id"]]
    hidden = as_key(acme, "GET", f"/v1/jobs/{theirs['id']}")
    assert hidden.status_code == 404 and hidden.json()["detail"] == f"job {theirs['id']!r} does not exist"
    assert "globex" not in hidden.text
    assert as_key(acme, "POST", f"/v1/jobs/{theirs['id']}/cancel").status_code == 404
    assert client.get(f"/v1/jobs/{theirs['id']}").json()["status"] == "queued"  # untouched

    everyone = {j["id"] for j in client.get("/v1/jobs").json()["data"]}
    assert everyone == {mine["id"], theirs["id"]}
    assert [j["id"] for j in client.get("/v1/jobs", params={"owner": "globex"}).json()["data"]] == [theirs["id"]]


@both_databases
@pytest.mark.parametrize("kind", ["jobs", "batches", "files"])
def test_a_list_cursor_naming_another_tenants_object_answers_as_a_missing_one(as_key, make_key, client, kind):
    """Otherwise `after=` is an oracle: it would tell a tenant that another's id exists and,
    by the page it gives, when it was made."""
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")

    def make(key: str) -> str:
        if kind == "jobs":
            return str(as_key(key, "POST", "/v1/jobs", json=NOOP).json()["id"])
        file_id = batch_file(client, key).json()["id"]
        if kind == "files":
            return str(file_id)
        batch = {"input_file_id": file_id, "endpoint": "/v1/embeddings"}
        return str(as_key(key, "POST", "/v1/batches", json=batch).json()["id"])

    mine, theirs = make(acme), make(globex)
    mine_later = make(acme)  # newer than theirs: a leaked cursor would page to `mine` alone
    missing = {"jobs": "job_nope", "batches": "batch_nope", "files": "file-nope"}[kind]
    singular = {"jobs": "job", "batches": "batch", "files": "file"}[kind]

    answers = [as_key(acme, "GET", f"/v1/{kind}", params={"after": cursor}) for cursor in (theirs, missing)]
    for answer, cursor in zip(answers, (theirs, missing), strict=True):
        assert answer.status_code == 422
        assert answer.json()["detail"] == f"`after` names {singular} {cursor!r}, which does not exist"
    assert "globex" not in answers[0].text
    # The tenant's own cursors still page; an admin pages across tenants with any id.
    own = as_key(acme, "GET", f"/v1/{kind}", params={"after": mine_later}).json()["data"]
    assert [o["id"] for o in own] == [mine]
    assert client.get(f"/v1/{kind}", params={"after": theirs}).status_code == 200


def test_the_same_idempotency_key_in_two_tenants_makes_two_jobs(as_key, make_key):
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")
    body = NOOP | {"idempotency_key": "nightly-1"}
    first = as_key(acme, "POST", "/v1/jobs", json=body)
    replay = as_key(acme, "POST", "/v1/jobs", json=body)
    other = as_key(globex, "POST", "/v1/jobs", json=body)
    assert (first.status_code, replay.status_code) == (202, 200) and replay.json()["id"] == first.json()["id"]
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]


@both_databases
def test_files_and_batches_belong_to_their_tenant(as_key, make_key, client):
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")
    file = batch_file(client, acme).json()
    assert as_key(globex, "GET", f"/v1/files/{file['id']}").status_code == 404
    assert as_key(globex, "GET", f"/v1/files/{file['id']}/content").status_code == 404
    stolen = as_key(globex, "POST", "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"})
    assert stolen.status_code == 404

    batch = as_key(acme, "POST", "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"})
    assert batch.status_code == 200 and batch.json()["owner"] == "acme"
    batch_id = batch.json()["id"]
    for path in (f"/v1/batches/{batch_id}", f"/v1/batches/{batch_id}/progress", f"/v1/batches/{batch_id}/results"):
        assert as_key(globex, "GET", path).status_code == 404, path
    assert as_key(globex, "POST", f"/v1/batches/{batch_id}/cancel").status_code == 404
    assert as_key(globex, "GET", "/v1/batches").json()["data"] == []
    assert [b["id"] for b in as_key(acme, "GET", "/v1/batches").json()["data"]] == [batch_id]
    jobs = as_key(acme, "GET", "/v1/jobs", params={"batch_id": batch_id}).json()["data"]
    assert [j["owner"] for j in jobs] == ["acme"]


def test_admins_create_list_and_revoke_keys_and_the_secret_is_shown_once(client, session):
    created = client.post(
        "/v1/keys", json={"name": "evals", "owner": "acme", "max_queued_jobs": 5, "max_submissions_per_minute": 60}
    )
    assert created.status_code == 201
    key = created.json()
    assert key["key"].startswith("gpuq_") and key["role"] == "submitter" and key["max_queued_jobs"] == 5
    stored = session.get(ApiKey, key["id"])
    assert key["key"] not in (stored.key_hash, stored.key_prefix) and len(stored.key_hash) == 64

    listed = client.get("/v1/keys").json()["data"]
    assert key["id"] in {k["id"] for k in listed} and all("key" not in k for k in listed)
    assert client.get("/v1/keys/me", headers=bearer(key["key"])).json()["owner"] == "acme"

    assert client.delete(f"/v1/keys/{key['id']}").status_code == 204
    assert client.get("/v1/keys/me", headers=bearer(key["key"])).status_code == 401
    assert client.delete(f"/v1/keys/{key['id']}").status_code == 404


@both_databases
def test_the_key_list_says_what_each_key_submitted_in_the_past_hour(as_key, make_key, client, database_url):
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")
    mine = [as_key(acme, "POST", "/v1/jobs", json=NOOP).json()["id"] for _ in range(3)]
    old = as_key(globex, "POST", "/v1/jobs", json=NOOP).json()
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:  # one of acme's finished; globex's job is two hours old
        s.execute(update(Job).where(Job.id == mine[0]).values(prompt_tokens=5, completion_tokens=7))
        s.execute(update(Job).where(Job.id == old["id"]).values(created_at=utcnow() - timedelta(hours=2)))
        s.commit()
    engine.dispose()
    usage = {k["owner"]: (k["jobs_last_hour"], k["tokens_last_hour"]) for k in client.get("/v1/keys").json()["data"]}
    assert usage == {"admin": (0, 0), "acme": (3, 12), "globex": (0, 0)}
    assert as_key(acme, "GET", "/v1/keys").status_code == 403


def test_the_last_admin_key_cannot_be_revoked(client):
    [me] = [k for k in client.get("/v1/keys").json()["data"] if k["role"] == "admin"]
    response = client.delete(f"/v1/keys/{me['id']}")
    assert response.status_code == 409 and "last active admin key" in response.json()["detail"]
    assert client.get("/v1/keys/me").status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "x", "owner": "acme", "role": "root"}, "role"),
        ({"name": "x", "owner": "a b"}, "owner"),
        ({"name": "x", "owner": "acme", "max_queued_jobs": 0}, "max_queued_jobs"),
        ({"owner": "acme"}, "name"),
    ],
)
def test_a_bad_key_request_is_a_422_and_creates_nothing(client, session, body, message):
    response = client.post("/v1/keys", json=body)
    assert response.status_code == 422 and message in response.json()["detail"]
    assert session.query(ApiKey).count() == 1


@both_databases
def test_a_key_over_its_queued_jobs_limit_gets_a_429_with_retry_after(as_key, make_key, job_rows, redis):
    limited = make_key("submitter", "acme", max_queued_jobs=2)
    assert as_key(limited, "POST", "/v1/jobs/bulk", json={"jobs": [NOOP, NOOP]}).status_code == 202
    over = as_key(limited, "POST", "/v1/jobs", json=NOOP)
    assert over.status_code == 429 and int(over.headers["retry-after"]) > 0
    assert "has 2 jobs queued and may have at most 2" in over.json()["detail"]
    assert len(job_rows()) == 2 and len(redis_job_keys(redis)) == 2
    other = make_key("submitter", "acme")  # the limit is the key's, not the tenant's
    assert as_key(other, "POST", "/v1/jobs", json=NOOP).status_code == 202


@both_databases
def test_concurrent_submissions_never_take_a_key_past_its_queued_jobs_limit(as_key, make_key, job_rows, redis):
    limited = make_key("submitter", "acme", max_queued_jobs=3)
    with ThreadPoolExecutor(max_workers=12) as pool:
        codes = list(pool.map(lambda _: as_key(limited, "POST", "/v1/jobs", json=NOOP).status_code, range(12)))
    assert sorted(codes) == [202] * 3 + [429] * 9
    assert len(job_rows()) == 3 and len(redis_job_keys(redis)) == 3


def test_a_key_over_its_submission_rate_gets_a_429_with_retry_after(as_key, make_key, job_rows):
    limited = make_key("submitter", "acme", max_submissions_per_minute=3)
    assert as_key(limited, "POST", "/v1/jobs/bulk", json={"jobs": [NOOP, NOOP]}).status_code == 202
    assert as_key(limited, "POST", "/v1/jobs", json=NOOP).status_code == 202
    over = as_key(limited, "POST", "/v1/jobs", json=NOOP)
    # the bucket refills at 3 a minute: one more job is 20 s away
    assert over.status_code == 429 and 1 <= int(over.headers["retry-after"]) <= 20
    assert "may submit 3 jobs a minute" in over.json()["detail"]
    too_big = as_key(
        make_key("submitter", "acme", max_submissions_per_minute=3), "POST", "/v1/jobs/bulk", json={"jobs": [NOOP] * 4}
    )
    assert too_big.status_code == 429 and "split it" in too_big.json()["detail"]
    assert len(job_rows()) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "noop", "model": "no-such-model"},  # 404
        {"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4096},  # 422: over the context
        {"kind": "noop", "model": MODEL, "webhook_url": "http://127.0.0.1:6379/"},  # 422: an internal destination
    ],
)
def test_refused_submissions_spend_none_of_the_keys_rate(as_key, make_key, client, job_rows, bad):
    limited = make_key("submitter", "acme", max_submissions_per_minute=2)
    for _ in range(5):
        assert as_key(limited, "POST", "/v1/jobs", json=bad).status_code in (404, 422)
    assert as_key(limited, "POST", "/v1/jobs/bulk", json={"jobs": [NOOP, bad]}).status_code in (404, 422)
    file = batch_file(client, limited).json()
    bad_batch = {"input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": "999h"}
    assert as_key(limited, "POST", "/v1/batches", json=bad_batch).status_code == 422
    # The whole minute's allowance is still there for work that is accepted.
    assert as_key(limited, "POST", "/v1/jobs/bulk", json={"jobs": [NOOP, NOOP]}).status_code == 202
    assert as_key(limited, "POST", "/v1/jobs", json=NOOP).status_code == 429
    assert len(job_rows()) == 2


def test_an_idempotent_replay_spends_nothing(as_key, make_key, job_rows):
    limited = make_key("submitter", "acme", max_submissions_per_minute=1)
    first = as_key(limited, "POST", "/v1/jobs", json=NOOP | {"idempotency_key": "k1"})
    again = as_key(limited, "POST", "/v1/jobs", json=NOOP | {"idempotency_key": "k1"})
    assert (first.status_code, again.status_code) == (202, 200) and again.json()["id"] == first.json()["id"]
    assert len(job_rows()) == 1


def test_a_batch_counts_its_lines_against_the_queued_jobs_limit(as_key, make_key, client, session):
    limited = make_key("submitter", "acme", max_queued_jobs=1)
    file = batch_file(client, limited).json()
    assert as_key(limited, "POST", "/v1/jobs", json=NOOP).status_code == 202
    refused = as_key(limited, "POST", "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"})
    assert refused.status_code == 429 and "retry-after" in refused.headers
    assert session.query(Job).filter(Job.batch_id.isnot(None)).count() == 0


@both_databases
def test_a_key_with_a_queued_jobs_limit_starts_a_batch_that_fits_it(as_key, make_key, client, job_rows):
    limited = make_key("submitter", "acme", max_queued_jobs=5)
    file = batch_file(client, limited).json()
    started = as_key(limited, "POST", "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"})
    assert started.status_code == 200 and started.json()["request_counts"]["total"] == 1
    assert len(job_rows()) == 1


def test_a_tenant_reads_only_its_own_webhook_deliveries(as_key, make_key, client, session):
    from gpuq.store.webhooks import new_delivery

    session.add_all(
        [
            new_delivery("job.succeeded", "http://hooks.acme/x", {"n": 1}, job_id="job_a", owner="acme"),
            new_delivery("job.failed", "http://hooks.globex/y", {"n": 2}, job_id="job_g", owner="globex"),
        ]
    )
    session.commit()
    acme = make_key("submitter", "acme")
    assert [d["job_id"] for d in as_key(acme, "GET", "/v1/webhooks/deliveries").json()["data"]] == ["job_a"]
    assert as_key(acme, "GET", "/v1/webhooks/deliveries", params={"job_id": "job_g"}).json()["data"] == []
    assert {d["job_id"] for d in client.get("/v1/webhooks/deliveries").json()["data"]} == {"job_a", "job_g"}


ROUNDS = 8


def revoke_at_once(pairs: list[tuple[TestClient, str, str]]) -> list[int]:
    """Each (client, secret, key id) revokes at the same moment; the statuses, sorted."""
    barrier = threading.Barrier(len(pairs))

    def revoke(c: TestClient, secret: str, key_id: str) -> int:
        barrier.wait()
        return c.delete(f"/v1/keys/{key_id}", headers=bearer(secret)).status_code

    with ThreadPoolExecutor(len(pairs)) as pool:
        return sorted(pool.map(lambda pair: revoke(*pair), pairs))


@both_databases
def test_two_admins_revoking_each_other_at_once_leave_one_admin_key(settings, session, make_key):
    """Each round starts with exactly two active admin keys, and each revokes the other at
    the same moment, through its own API instance: one revocation wins, the other is refused
    (409, or 401 once its own key is gone), and an admin key is always left."""
    from api.main import create_app
    from gpuq.db.tables import Role

    def active_admins() -> dict[str, str]:
        """key prefix -> id of every active admin key."""
        session.expire_all()
        rows = session.query(ApiKey).filter(ApiKey.role == Role.ADMIN.value, ApiKey.revoked_at.is_(None))
        return {k.key_prefix: k.id for k in rows}

    survivor = make_key("admin", "ops")
    with TestClient(create_app(settings)) as first, TestClient(create_app(settings)) as second:
        for _ in range(ROUNDS):
            newcomer = make_key("admin", "ops")
            ids = active_admins()
            assert len(ids) == 2
            a, b = ids[survivor[:12]], ids[newcomer[:12]]
            codes = revoke_at_once([(first, survivor, b), (second, newcomer, a)])
            left = active_admins()
            assert len(left) == 1, f"no admin key is left after {codes}"
            assert codes in ([204, 401], [204, 409]), codes
            survivor = survivor if survivor[:12] in left else newcomer


@both_databases
def test_a_submitter_reads_its_own_batchs_output_and_error_files_with_the_openai_client(
    client, make_key, session, redis, settings
):
    """OpenAI's flow, files.content(batch.output_file_id), works for the batch's tenant's keys
    and answers 404 to another tenant's."""
    import openai

    from gpuq.batches.service import advance_batches
    from tests.gpuq.batches.test_finalize import chat_line, finish_lines

    def as_tenant(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)

    acme, globex = as_tenant(make_key("submitter", "acme")), as_tenant(make_key("submitter", "globex"))
    lines = "\n".join(json.dumps(chat_line(c)) for c in ("a", "b")).encode()
    uploaded = acme.files.create(file=("in.jsonl", lines), purpose="batch")
    batch = acme.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    finish_lines(session, batch.id, succeeded=("a",), failed=("b",))
    assert advance_batches(session, redis, settings.data_dir) == [batch.id]
    done = acme.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id and done.error_file_id
    [ok] = acme.files.content(done.output_file_id).text.splitlines()
    [err] = acme.files.content(done.error_file_id).text.splitlines()
    assert json.loads(ok)["custom_id"] == "a" and json.loads(err)["custom_id"] == "b"
    assert acme.files.retrieve(done.output_file_id).purpose == "batch_output"
    for file_id in (done.output_file_id, done.error_file_id, uploaded.id):
        with pytest.raises(openai.NotFoundError):
            globex.files.content(file_id)


@both_databases
def test_a_second_active_key_of_the_same_name_and_owner_is_a_409_and_creates_nothing(client):
    first = client.post("/v1/keys", json={"name": "evals", "owner": "acme"}).json()
    again = client.post("/v1/keys", json={"name": "evals", "owner": "acme"})
    assert again.status_code == 409
    assert again.json()["detail"] == (
        f"acme already has an active key named 'evals' ({first['id']}): choose another name, or revoke that key first"
    )
    assert [k["id"] for k in client.get("/v1/keys").json()["data"] if k["name"] == "evals"] == [first["id"]]
    # Another tenant's key of that name, or one after the first is revoked, is fine.
    assert client.post("/v1/keys", json={"name": "evals", "owner": "globex"}).status_code == 201
    assert client.delete(f"/v1/keys/{first['id']}").status_code == 204
    assert client.post("/v1/keys", json={"name": "evals", "owner": "acme"}).status_code == 201
