"""Every refusal and every fault is JSON in one shape, with the same status for the same
fault on every route, and the OpenAPI document declares exactly that."""

import json

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from gpuq.db.tables import File
from tests.api.conftest import bearer
from tests.api.test_batches_api import line, stored_files, table

MODEL = "smollm2-135m"
GEN = {"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4}


def error_shape(body: dict) -> tuple[str, str]:
    """(message, type), having checked the body is gpuq's error shape."""
    assert set(body) == {"detail", "error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["detail"] == body["error"]["message"]
    return body["detail"], body["error"]["type"]


def chunks(data: bytes, size: int = 1024):
    """A body without Content-Length: httpx sends an iterator as Transfer-Encoding: chunked."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_a_chunked_json_body_over_the_limit_is_a_413_and_queues_nothing(client, job_rows):
    body = json.dumps(GEN | {"prompt": "x" * 70_000}).encode()
    response = client.post("/v1/jobs", content=chunks(body), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    message, _type = error_shape(response.json())
    assert "larger than 65536 bytes" in message and response.json()["error"]["code"] == "body_too_large"
    assert job_rows() == []


def test_a_chunked_upload_over_the_limit_is_a_413_and_keeps_nothing(settings, admin_key, session):
    small = settings.model_copy(update={"max_upload_bytes": 4096})
    boundary = "gpuq-test-boundary"
    content = (line("a") + "\n") * 100
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        f"Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    ).encode()
    headers = bearer(admin_key) | {"content-type": f"multipart/form-data; boundary={boundary}"}
    with TestClient(create_app(small)) as c:
        response = c.post("/v1/files", content=chunks(multipart), headers=headers)
    assert response.status_code == 413, response.text
    assert "larger than 4096 bytes" in error_shape(response.json())[0]
    assert table(session, File) == [] and stored_files(settings) == []


@pytest.mark.parametrize(("path", "shape"), [("/v1/boom", "gpuq"), ("/api/boom", "ollama")])
def test_a_fault_inside_gpuq_is_a_json_500_that_keeps_its_details_in_the_log(settings, path, shape, caplog):
    app = create_app(settings)

    async def boom() -> None:
        raise RuntimeError("secret detail: /srv/gpuq/internal.db")

    app.add_api_route(path, boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        response = c.get(path)
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    if shape == "ollama":
        assert set(response.json()) == {"error"} and "RuntimeError" in response.json()["error"]
        return
    message, error_type = error_shape(response.json())
    assert error_type == "server_error" and "RuntimeError" in message and "in the server's log" in message
    assert "secret detail" not in response.text  # the exception's text can hold paths, SQL, other tenants' data
    assert f"GET {path} failed with RuntimeError" in caplog.text


def test_a_body_that_is_not_json_nor_a_form_is_a_400_in_the_error_shape(client):
    response = client.post("/v1/files", content=b"not a form", headers={"content-type": "multipart/form-data"})
    assert response.status_code == 400, response.text
    assert "could not be parsed" in error_shape(response.json())[0]


def test_the_same_fault_has_the_same_status_on_job_and_batch_routes(client):
    """An unknown page cursor, a bad value in a file or a batch: 422 wherever it happens."""
    assert client.get("/v1/jobs", params={"after": "job_nope"}).status_code == 422
    assert client.get("/v1/batches", params={"after": "batch_nope"}).status_code == 422
    bad_line = client.post(
        "/v1/files", files={"file": ("in.jsonl", b"[1]")}, data={"purpose": "batch"}
    )  # a bad value in a file
    assert bad_line.status_code == 422
    file_id = client.post(
        "/v1/files", files={"file": ("in.jsonl", line("a", model="nope").encode())}, data={"purpose": "batch"}
    ).json()["id"]
    bad_batch = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"})
    bad_job = client.post("/v1/jobs", json=GEN | {"max_tokens": 0})
    assert bad_batch.status_code == bad_job.status_code == 422
    for response in (bad_line, bad_batch, bad_job):
        assert error_shape(response.json())[1] == "invalid_request_error"


def operations(doc: dict):
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_the_openapi_document_declares_the_error_shape_the_server_sends(client):
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(doc)  # FastAPI's array of errors: gpuq never sends it
    error_schema = doc["components"]["schemas"]["ErrorBody"]
    assert set(error_schema["required"]) == {"detail", "error"}
    for path, method, operation in operations(doc):
        responses = operation["responses"]
        where = f"{method.upper()} {path}"
        assert "500" in responses, where
        anthropic = path.startswith("/v1/messages")  # Anthropic's {"type": "error", "error": {...}}, 400 for 422
        shape = "OllamaErrorBody" if path.startswith("/api/") else "AnthropicErrorBody" if anthropic else "ErrorBody"
        for status, response in responses.items():
            if int(status) >= 400 and path != "/readyz":
                assert response["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{shape}"}, (
                    f"{where} {status}"
                )
        if operation.get("security"):
            assert "401" in responses, where
        if operation.get("parameters") or "requestBody" in operation:
            assert ("400" if anthropic else "422") in responses, where
            assert not anthropic or "422" not in responses, where
        if "requestBody" in operation:
            assert {"400", "413"} <= set(responses), where
    paths = doc["paths"]
    assert {"200", "202", "404", "409", "429", "503"} <= set(paths["/v1/jobs"]["post"]["responses"])
    assert "403" in paths["/v1/schedules"]["post"]["responses"]  # admins' routes say so
    assert "403" not in paths["/v1/jobs"]["get"]["responses"]
    assert set(paths["/v1/batches/{batch_id}/results"]["get"]["responses"]["200"]["content"]) == {"application/jsonl"}
    assert doc["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a gpuq API key (`gpuq keys create`)",
    }


def test_a_missing_key_is_a_401_that_names_the_scheme(settings, admin_key):
    with TestClient(create_app(settings)) as anonymous:
        response = anonymous.get("/v1/jobs")
        basic = anonymous.get("/v1/jobs", headers={"authorization": "Basic abc"})
    assert response.status_code == basic.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "needs an API key" in error_shape(response.json())[0]
