"""Model aliases: a name a client insists on (the `llm` CLI's `text-embedding-3-small`) runs
as a registered model's own jobs; bad aliases are refused and change nothing."""

import json

import pytest

from tests.api.conftest import bearer, queued_ids
from tests.conftest import both_databases

MODEL = "smollm2-135m"
ALIAS = "text-embedding-3-small"


def set_alias(client, alias=ALIAS, model=MODEL, **kwargs):
    return client.put(f"/v1/model-aliases/{alias}", json={"model": model}, **kwargs)


@both_databases
def test_an_alias_is_listed_beside_its_model_and_read_as_it(client):
    made = set_alias(client)
    assert made.status_code == 200, made.text
    assert made.json()["alias"] == ALIAS and made.json()["model"] == MODEL
    listed = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["alias_of"]) for m in listed] == [(MODEL, None), (ALIAS, MODEL)]
    assert listed[1]["kinds"] == listed[0]["kinds"] and listed[1]["context_length"] == 2048
    read = client.get(f"/v1/models/{ALIAS}").json()
    assert read["id"] == ALIAS and read["alias_of"] == MODEL
    assert client.get("/v1/model-aliases").json()["data"][0]["model"] == MODEL
    assert client.delete(f"/v1/model-aliases/{ALIAS}").status_code == 204
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL]
    assert client.get(f"/v1/models/{ALIAS}").status_code == 404


@both_databases
def test_jobs_sent_under_an_alias_are_the_models_own(client, redis, job_rows):
    set_alias(client)
    job = client.post("/v1/jobs", json={"kind": "embed", "model": ALIAS, "input": ["hello"]}).json()
    assert job["model"] == MODEL
    assert queued_ids(redis, f"gpuq:{MODEL}:embed:{job['priority']}:admin") == [job["id"]]
    assert [row.model for row in job_rows()] == [MODEL]


def test_an_alias_in_a_batch_file_queues_the_models_jobs(client, redis):
    set_alias(client, "gpt-4o-mini")
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body} for i in range(2)]
    file = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode())},
        data={"purpose": "batch"},
    ).json()
    batch = client.post(
        "/v1/batches",
        json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )
    assert batch.status_code == 200, batch.text
    assert {j["model"] for j in client.get("/v1/jobs").json()["data"]} == {MODEL}
    assert len(queued_ids(redis, f"gpuq:{MODEL}:generate:low:admin")) == 2


@pytest.mark.parametrize(
    ("alias", "model", "status", "message"),
    [
        (MODEL, MODEL, 409, "is a registered model's own name"),
        ("gpt-4o", "nope", 404, "model 'nope' is not registered"),
        ("has space", MODEL, 422, "alias 'has space' is invalid"),
        ("x" * 129, MODEL, 422, "at most 128 characters"),
    ],
)
def test_impossible_aliases_are_refused_and_change_nothing(client, alias, model, status, message):
    response = set_alias(client, alias, model)
    assert response.status_code == status and message in response.json()["detail"], response.text
    assert client.get("/v1/model-aliases").json()["data"] == []


def test_an_alias_of_an_alias_is_refused(client):
    set_alias(client, "first")
    response = set_alias(client, "second", "first")
    assert response.status_code == 404 and "not another alias" in response.json()["detail"]


def test_only_admins_set_aliases_and_a_model_cannot_take_an_aliass_name(client, make_key, settings, model_path):
    submitter = bearer(make_key("submitter", "acme"))
    assert set_alias(client, headers=submitter).status_code == 403
    assert client.get("/v1/model-aliases", headers=submitter).json()["data"] == []
    assert client.delete(f"/v1/model-aliases/{ALIAS}").status_code == 404
    set_alias(client)
    (settings.models_dir / "real.gguf").symlink_to(model_path)
    taken = client.post("/v1/models", json={"name": ALIAS, "path": "real.gguf"})
    assert taken.status_code == 409 and "is an alias" in taken.json()["detail"]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL, ALIAS]
