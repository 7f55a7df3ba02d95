"""The drop-in routes' refusals, files list and delete, and keys' default priority, on the
API in-process (real SQL and Redis; no worker: nothing here needs a job to run)."""

import json

import pytest

from tests.api.conftest import bearer, redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}  # no grammar enforces it
TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/chat/completions", CHAT | {"n": 0}, "n", "n: Input should be greater than or equal to 1"),
        ("/v1/chat/completions", CHAT | {"n": 129}, "n", "n: Input should be less than or equal to 128"),
        ("/v1/chat/completions", CHAT | {"tools": [{"type": "function"}]}, "tools[0]", "is not a function tool"),
        ("/v1/chat/completions", CHAT | {"top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs: true"),
        ("/v1/chat/completions", CHAT | {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "echo": True, "stream": True}, "echo", "with stream"),
        (
            "/v1/chat/completions",
            CHAT | {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE}}},
            "response_format.json_schema.schema",
            'the keyword(s) ["uniqueItems"] cannot be enforced',
        ),
        (
            "/v1/chat/completions",
            CHAT | {"response_format": {"type": "xml"}},
            "response_format.type",
            "text, json_object or json_schema",
        ),
        (
            "/v1/chat/completions",
            CHAT | {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice",
            "'other', which is not one of tools",
        ),
        (
            "/v1/chat/completions",
            CHAT | {"tools": [TOOL | {"function": {"name": "f", "parameters": UNIQUE}}], "tool_choice": "required"},
            "tools",
            'the keyword(s) ["uniqueItems"] cannot be enforced',
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "give the JSON schema",
        ),
        ("/v1/chat/completions", CHAT | {"frobnicate": 1}, "frobnicate", "unrecognized request argument"),
        ("/v1/chat/completions", CHAT | {"max_tokens": 9999}, "max_tokens", "has a context of 2048 tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ("/v1/embeddings", {"model": MODEL, "input": ["a", ""]}, "input", "input[1] is empty"),
    ],
)
def test_an_openai_request_gpuq_cannot_honour_is_a_400_naming_the_parameter_and_queues_nothing(
    client, redis, job_rows, path, body, param, message
):
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_an_unknown_model_is_a_404_in_each_apis_own_shape(client, job_rows):
    openai = client.post("/v1/chat/completions", json=CHAT | {"model": "nope"})
    assert openai.status_code == 404 and openai.json()["error"]["code"] == "model_not_found"
    assert "'nope'" in openai.json()["error"]["message"]
    ollama = client.post("/api/chat", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert ollama.status_code == 404 and ollama.json() == {"error": "model 'nope' not found"}
    shown = client.post("/api/show", json={"model": "nope"})
    assert shown.status_code == 404 and shown.json() == {"error": "model 'nope' not found"}
    assert job_rows() == []


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/generate", {"prompt": "hi", "format": UNIQUE}, 'format: the keyword(s) ["uniqueItems"] cannot be'),
        ("/api/generate", {"prompt": "hi", "format": "yaml"}, 'format must be "json" or a JSON schema'),
        ("/api/generate", {"prompt": "hi", "images": ["aGk="]}, "images is not supported"),
        ("/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}"}, "template is not supported"),
        ("/api/generate", {"prompt": "hi", "keep_alive": "soon"}, "keep_alive 'soon' is not a duration"),
        ("/api/generate", {"prompt": "hi", "options": {"mirostat": 2}}, "options.mirostat is not supported"),
        ("/api/generate", {"prompt": "hi", "options": {"num_ctx": 4096}}, "num_ctx is 4096"),
        (
            "/api/generate",
            {"prompt": "hi", "options": {"temperature": 7}},
            "options.temperature: Input should be less than or equal to 2",
        ),
        ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role is not supported"),
    ],
)
def test_an_ollama_request_gpuq_cannot_honour_is_a_400_in_ollamas_shape(client, job_rows, path, body, message):
    response = client.post(path, json={"model": MODEL} | body)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and message in response.json()["error"]
    assert job_rows() == []


def test_a_bad_priority_header_is_refused_before_anything_is_queued(client, job_rows):
    response = client.post("/v1/chat/completions", json=CHAT, headers={"X-Gpuq-Priority": "asap"})
    assert response.status_code == 400 and "unknown priority 'asap'" in response.json()["error"]["message"]
    assert job_rows() == []


def test_ollamas_routes_that_need_no_job(client):
    assert client.get("/api/version").json() == {"version": client.app.version}
    [tag] = client.get("/api/tags").json()["models"]
    # Named with the tag Ollama's clients expect, and taken back with it.
    assert (tag["name"], tag["model"]) == (f"{MODEL}:latest", f"{MODEL}:latest")
    assert tag["details"]["parameter_size"] == "135M"
    assert client.post("/api/show", json={"model": tag["name"]}).status_code == 200
    assert client.get("/api/ps").json() == {"models": []}  # no worker holds anything
    assert client.post("/api/pull", json={"model": f"{MODEL}:latest"}).json() == {"status": "success"}


def test_a_keys_default_priority_applies_to_its_jobs_that_name_none(client, as_key):
    created = client.post("/v1/keys", json={"name": "evals", "owner": "research", "default_priority": "low"})
    assert created.status_code == 201 and created.json()["default_priority"] == "low"
    key = created.json()["key"]
    assert as_key(key, "GET", "/v1/keys/me").json()["default_priority"] == "low"
    body = {"kind": "noop", "model": MODEL}
    assert as_key(key, "POST", "/v1/jobs", json=body).json()["priority"] == "low"
    assert as_key(key, "POST", "/v1/jobs", json=body | {"priority": "high"}).json()["priority"] == "high"
    assert client.post("/v1/jobs", json=body).json()["priority"] == "normal"  # a key without one
    refused = client.post("/v1/keys", json={"name": "x", "owner": "y", "default_priority": "urgent"})
    assert refused.status_code == 422


@pytest.fixture
def as_key(client):
    def send(key: str, method: str, path: str, **kwargs):
        return client.request(method, path, headers=bearer(key), **kwargs)

    return send


def _upload(client, key, custom_id="a"):
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "hi"}}
    response = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", (json.dumps(line) + "\n").encode())},
        data={"purpose": "batch"},
        headers=bearer(key),
    )
    assert response.status_code == 200, response.text
    return response.json()


@both_databases
def test_files_are_listed_per_tenant_paged_and_deleted_with_their_bytes(client, make_key, as_key, settings):
    acme, globex = make_key("submitter", "acme"), make_key("submitter", "globex")
    first, second, third = (_upload(client, acme, str(i)) for i in range(3))
    theirs = _upload(client, globex)

    listed = as_key(acme, "GET", "/v1/files").json()
    assert [f["id"] for f in listed["data"]] == [third["id"], second["id"], first["id"]]
    assert listed["object"] == "list" and listed["has_more"] is False and listed["last_id"] == first["id"]
    page = as_key(acme, "GET", "/v1/files", params={"limit": 2, "order": "asc"}).json()
    assert [f["id"] for f in page["data"]] == [first["id"], second["id"]] and page["has_more"]
    rest = as_key(acme, "GET", "/v1/files", params={"order": "asc", "after": second["id"]}).json()
    assert [f["id"] for f in rest["data"]] == [third["id"]]
    assert theirs["id"] in [f["id"] for f in client.get("/v1/files").json()["data"]]  # admins see all

    assert as_key(globex, "DELETE", f"/v1/files/{first['id']}").status_code == 404  # another tenant's
    on_disk = list((settings.data_dir / "files").glob(f"{first['id']}*"))
    assert len(on_disk) == 1
    deleted = as_key(acme, "DELETE", f"/v1/files/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "file", "deleted": True}
    assert not on_disk[0].exists() and as_key(acme, "GET", f"/v1/files/{first['id']}").status_code == 404
    assert as_key(acme, "DELETE", f"/v1/files/{first['id']}").status_code == 404


def test_a_file_a_schedule_reads_is_not_deleted(client, settings):
    file = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                                                 "body": {"model": MODEL, "input": "hi"}}).encode() + b"\n")},
        data={"purpose": "batch"},
    ).json()  # fmt: skip
    schedule = {"name": "nightly", "cron": "0 2 * * *", "input_file_id": file["id"], "endpoint": "/v1/embeddings"}
    assert client.post("/v1/schedules", json=schedule).status_code == 201
    refused = client.delete(f"/v1/files/{file['id']}")
    assert refused.status_code == 409 and "schedule 'nightly'" in refused.json()["detail"]
    assert client.get(f"/v1/files/{file['id']}").status_code == 200


def test_the_openapi_document_declares_the_drop_in_routes_and_their_refusals(client):
    paths = client.get("/openapi.json").json()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "404", "429"} <= set(chat) and "text/event-stream" in chat["200"]["content"]
    assert {"200", "400", "404"} <= set(paths["/api/chat"]["post"]["responses"])
    assert "delete" in paths["/v1/files/{file_id}"] and "get" in paths["/v1/files"]
