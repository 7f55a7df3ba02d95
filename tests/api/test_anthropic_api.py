"""Anthropic's Messages API and Message Batches on the API in-process (real SQL and Redis, no
worker): every refusal in Anthropic's shape with nothing queued, the key as x-api-key,
count_tokens, and a Message Batch's life up to its results and its deletion."""

import json

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from gpuq.batches.service import advance_batches
from gpuq.db.tables import Batch, File, Job
from tests.api.conftest import redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
HI = [{"role": "user", "content": "hi"}]
ASK = {"model": MODEL, "max_tokens": 8, "messages": HI}
COUNT = {"model": MODEL, "messages": HI}
TOOL = {"name": "weather", "description": "the weather in a city", "input_schema": {"type": "object"}}
UNIQUE = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}


def anthropic_error(response, status: int, kind: str = "invalid_request_error") -> str:
    """The refusal's message, once its status and shape are Anthropic's."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"} and body["error"]["type"] == kind
    return str(body["error"]["message"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({k: v for k, v in ASK.items() if k != "max_tokens"}, "max_tokens: Field required"),
        (ASK | {"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        (ASK | {"temperature": 1.5}, "temperature: Input should be less than or equal to 1"),
        (ASK | {"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
        (ASK | {"messages": []}, "messages: List should have at least 1 item"),
        (ASK | {"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        (
            ASK
            | {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}
                ]
            },
            "messages[0].content[0]: a content block of type 'image' (gpuq's models read text only) is not supported",
        ),
        (
            ASK | {"messages": [*HI, {"role": "assistant", "content": "Sure,"}]},
            "a last message from the assistant (a prefill",
        ),
        (
            ASK | {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id: name the tool_use block it answers",
        ),
        (ASK | {"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences: at most 4"),
        (ASK | {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking: extended thinking"),
        (ASK | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "the server tool"),
        (ASK | {"tools": [{"name": "w"}]}, "tools[0].input_schema: the JSON schema of its input"),
        (ASK | {"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice.type: auto, any, tool or none"),
        (ASK | {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "'other', which is not one of"),
        (
            ASK | {"tools": [TOOL | {"input_schema": UNIQUE}], "tool_choice": {"type": "any"}},
            'the keyword(s) ["uniqueItems"] cannot be enforced',
        ),
        (ASK | {"max_tokens": 9999}, "has a context of 2048 tokens"),
        (
            ASK | {"output_config": {"format": {"type": "json_schema", "schema": UNIQUE}}},
            'output_config.format.schema: the keyword(s) ["uniqueItems"] cannot be enforced',
        ),
        (ASK | {"output_config": {"effort": "high"}}, "output_config.effort: an effort level"),
    ],
)
def test_a_message_gpuq_cannot_honour_is_a_400_in_anthropics_shape_and_queues_nothing(
    client, redis, job_rows, body, message
):
    response = client.post("/v1/messages", json=body)
    assert message in anthropic_error(response, 400)
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_anthropics_other_refusals_keep_its_shape(client, settings, job_rows):
    missing = client.post("/v1/messages", json=ASK | {"model": "nope"})
    assert "'nope' is not registered" in anthropic_error(missing, 404, "not_found_error")
    broken = client.post("/v1/messages", content=b"{not json", headers={"Content-Type": "application/json"})
    assert "not valid JSON" in anthropic_error(broken, 400)
    big = client.post("/v1/messages", json=ASK | {"system": "x" * settings.max_body_bytes})
    assert "larger than" in anthropic_error(big, 413, "request_too_large")
    batch = client.get("/v1/messages/batches/msgbatch_nope")
    assert "msgbatch_nope" in anthropic_error(batch, 404, "not_found_error")
    priority = client.post("/v1/messages", json=ASK, headers={"X-Gpuq-Priority": "urgent"})
    assert "X-Gpuq-Priority" in anthropic_error(priority, 400)
    assert job_rows() == []


def test_the_key_goes_as_x_api_key_or_a_bearer_token_and_a_missing_one_is_an_authentication_error(settings, admin_key):
    with TestClient(create_app(settings)) as bare:
        nothing = bare.post("/v1/messages/count_tokens", json=COUNT)
        assert "x-api-key" in anthropic_error(nothing, 401, "authentication_error")
        wrong = bare.post("/v1/messages/count_tokens", json=COUNT, headers={"x-api-key": "gpuq_nope"})
        assert "not valid" in anthropic_error(wrong, 401, "authentication_error")
        headers = {"x-api-key": admin_key, "anthropic-version": "2023-06-01"}
        by_header = bare.post("/v1/messages/count_tokens", json=COUNT, headers=headers)
        by_bearer = bare.post("/v1/messages/count_tokens", json=COUNT, headers={"Authorization": f"Bearer {admin_key}"})
        assert by_header.status_code == by_bearer.status_code == 200, by_header.text
        assert by_header.json() == by_bearer.json() and by_header.json()["input_tokens"] > 0
        # Every route takes it (the anthropic SDK sends it to all it calls), in that route's own error shape.
        assert bare.get("/v1/models", headers={"x-api-key": admin_key}).status_code == 200
        refused = bare.get("/v1/models", headers={"x-api-key": "gpuq_nope"})
        assert refused.status_code == 401 and "not valid" in refused.json()["detail"]


def test_count_tokens_counts_the_system_the_messages_and_the_tools(client, job_rows):
    def count(**extra) -> int:
        response = client.post("/v1/messages/count_tokens", json={"model": MODEL, **extra})
        assert response.status_code == 200, response.text
        assert set(response.json()) == {"input_tokens"}
        return int(response.json()["input_tokens"])

    messages = HI
    brief = count(messages=messages, system=[{"type": "text", "text": "You answer in French."}])
    longer = count(messages=messages, system="You answer in French. " * 10)
    with_tools = count(messages=messages, system="You answer in French.", tools=[TOOL])
    assert 0 < brief < longer and brief < with_tools
    assert count(messages=messages, system="You answer in French.") == brief  # a string or blocks, the same
    assert job_rows() == []  # nothing ran
    refused = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": messages, "max_tokens": 5})
    assert "max_tokens: Extra inputs are not permitted" in anthropic_error(refused, 400)


# ---------------------------------------------------------------- Message Batches


def requests(n: int, **params) -> list[dict]:
    return [{"custom_id": f"r{i}", "params": ASK | params} for i in range(n)]


def test_a_message_batch_with_a_bad_request_is_refused_whole_naming_it(client, redis, settings, session):
    body = {
        "requests": [
            *requests(2),
            {"custom_id": "bad", "params": ASK | {"max_tokens": 0}},
            {"custom_id": "r0", "params": ASK},
            {"custom_id": "img", "params": ASK | {"messages": [{"role": "user", "content": [{"type": "image"}]}]}},
            {"custom_id": "too long!", "params": ASK},
        ]
    }
    message = anthropic_error(client.post("/v1/messages/batches", json=body), 400)
    assert message.startswith("4 invalid requests")
    assert "requests[2] (custom_id 'bad'): params.max_tokens: Input should be greater than or equal to 1" in message
    assert "requests[3] (custom_id 'r0'): custom_id is used twice" in message
    assert "requests[4] (custom_id 'img'): params.messages[0].content[0]" in message
    assert "requests[5].custom_id: 1 to 64 letters" in message
    streamed = {"requests": requests(1, stream=True)}
    assert "stream" in anthropic_error(client.post("/v1/messages/batches", json=streamed), 400)
    unknown_model = {"requests": requests(1, model="nope")}
    refused = anthropic_error(client.post("/v1/messages/batches", json=unknown_model), 400)
    assert "requests[0]" in refused and "'nope'" in refused
    empty = client.post("/v1/messages/batches", json={"requests": []})
    assert "requests" in anthropic_error(empty, 400)
    session.expire_all()
    assert session.query(Batch).count() == 0 and session.query(File).count() == 0
    assert list((settings.data_dir / "files").glob("*")) == [] and redis_job_keys(redis) == []


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


DEEP = b'{"requests": [{"custom_id": "a", "params": ' + b"[" * 80 + b"]" * 80 + b"}]}"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"requests": [{"custom_id": "a", "params": ', "the request body is not valid JSON (parse error: premature"),
        (b'{"requests": [] } trailing', "not valid JSON (parse error: trailing garbage"),
        (b"", "not valid JSON"),
        (b'[{"custom_id": "a"}]', 'the request body is a JSON object: {"requests": ['),
        (_raw({"priority": "low"}), "requests: Field required"),
        (_raw({"requests": {"custom_id": "a"}}), "requests: Input should be a valid list"),
        (b'{"requests": [], "requests": []}', "requests: give it once"),
        (_raw({"requests": requests(1), "priority": "urgent"}), "priority: unknown priority 'urgent'"),
        (_raw({"requests": requests(1), "priority": ["low"]}), "priority: "),
        (_raw({"requests": requests(1), "webhook_url": "not a url"}), "webhook_url: Input should be a valid URL"),
        (_raw({"requests": requests(1), "frobnicate": {"a": 1}}), "frobnicate: Extra inputs are not permitted"),
        (DEEP, "the request body is nested more than 64 levels deep"),
        (
            _raw({"requests": requests(1, system="a\x00b")}),
            "requests[0] (custom_id 'r0'): `params.system` contains a NUL character",
        ),
        (b'{"requests": [{"custom_id": "a", "params": {"system": "\\udfff"}}]}', "a lone UTF-16 surrogate"),
    ],
)
def test_a_message_batch_body_that_cannot_be_read_is_a_400_leaving_nothing(
    client, session, redis, settings, body, message
):
    response = client.post("/v1/messages/batches", content=body, headers={"Content-Type": "application/json"})
    assert message in anthropic_error(response, 400)
    session.expire_all()
    assert session.query(Batch).count() == 0 and session.query(File).count() == 0
    assert list((settings.data_dir / "files").glob("*")) == [] and redis_job_keys(redis) == []


def test_a_message_batch_body_sent_in_chunks_is_read_as_one(client):
    """No Content-Length (chunked transfer, as a client streaming a large body sends it)."""
    body = _raw({"webhook_url": "http://hooks.example/hook", "requests": requests(3), "priority": "high"})
    chunks = (body[i : i + 7] for i in range(0, len(body), 7))  # keys and strings cut across chunks
    created = client.post("/v1/messages/batches", content=chunks, headers={"Content-Type": "application/json"})
    assert created.status_code == 200, created.text
    assert created.json()["request_counts"]["processing"] == 3
    assert [j["priority"] for j in client.get("/v1/jobs").json()["data"]] == ["high"] * 3


def test_a_chunked_message_batch_body_over_the_limit_is_a_413_leaving_no_spooled_part(settings, admin_key, session):
    body = _raw({"requests": requests(40)})
    chunks = (body[i : i + 512] for i in range(0, len(body), 512))  # no Content-Length: counted as it is read
    small = settings.model_copy(update={"max_upload_bytes": 4096})
    with TestClient(create_app(small), headers={"x-api-key": admin_key}) as c:
        response = c.post("/v1/messages/batches", content=chunks, headers={"Content-Type": "application/json"})
    assert "larger than 4096 bytes" in anthropic_error(response, 413, "request_too_large")
    session.expire_all()
    assert session.query(Batch).count() == 0 and list((settings.data_dir / "files").glob("*")) == []


@both_databases
def test_a_message_batch_runs_as_gpuq_jobs_is_canceled_ended_read_and_deleted(client, session, redis, settings):
    hook = "http://hooks.example/hook"
    created = client.post(
        "/v1/messages/batches", json={"requests": requests(3), "priority": "normal", "webhook_url": hook}
    )
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["id"].startswith("msgbatch_") and batch["type"] == "message_batch"
    assert batch["processing_status"] == "in_progress" and batch["results_url"] is None
    assert batch["request_counts"] == {"processing": 3, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    assert batch["created_at"].endswith("Z") and batch["expires_at"] > batch["created_at"]
    jobs = client.get("/v1/jobs").json()["data"]
    assert [j["priority"] for j in jobs] == ["normal"] * 3 and len(redis_job_keys(redis)) == 3
    # An OpenAI batch lists apart; the Message Batch is not among /v1/batches.
    assert client.get("/v1/batches").json()["data"] == []

    running = client.delete(f"/v1/messages/batches/{batch['id']}")
    assert "cancel it" in anthropic_error(running, 409)

    canceling = client.post(f"/v1/messages/batches/{batch['id']}/cancel").json()
    assert canceling["processing_status"] == "canceling" and canceling["cancel_initiated_at"]
    assert canceling["request_counts"]["canceled"] == 3 and redis_job_keys(redis) == []
    assert advance_batches(session, redis, settings.data_dir) == [batch["id"]]
    ended = client.get(f"/v1/messages/batches/{batch['id']}").json()
    assert ended["processing_status"] == "ended" and ended["ended_at"]
    assert ended["results_url"].endswith(f"/v1/messages/batches/{batch['id']}/results")
    [delivery] = client.get("/v1/webhooks/deliveries", params={"batch_id": batch["id"]}).json()["data"]
    assert delivery["event"] == "batch.cancelled"  # its webhook, as an OpenAI batch's
    results = client.get(f"/v1/messages/batches/{batch['id']}/results")
    lines = [json.loads(line) for line in results.text.splitlines()]
    assert sorted((r["custom_id"], r["result"]["type"]) for r in lines) == [(f"r{i}", "canceled") for i in range(3)]

    deleted = client.delete(f"/v1/messages/batches/{batch['id']}")
    assert deleted.json() == {"id": batch["id"], "type": "message_batch_deleted"}
    assert anthropic_error(client.get(f"/v1/messages/batches/{batch['id']}"), 404, "not_found_error")
    session.expire_all()
    assert session.query(Batch).count() == session.query(Job).count() == session.query(File).count() == 0
    assert list((settings.data_dir / "files").glob("*.jsonl")) == []


def test_a_message_batch_past_its_window_ends_with_its_requests_expired(client, session, redis, settings):
    batch = client.post("/v1/messages/batches", json={"requests": requests(2)}).json()
    row = session.get(Batch, batch["id"])
    row.expires_at = row.created_at  # its day has run out
    session.commit()
    assert advance_batches(session, redis, settings.data_dir) == [batch["id"]]
    ended = client.get(f"/v1/messages/batches/{batch['id']}").json()
    assert ended["processing_status"] == "ended"
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 2}
    assert ended["processing_status"] == "ended" and ended["request_counts"] == counts
    results = client.get(ended["results_url"].split("testserver", 1)[1]).text.splitlines()
    assert {json.loads(r)["result"]["type"] for r in results} == {"expired"}


def test_message_batches_page_as_anthropic_pages_them(client):
    ids = [client.post("/v1/messages/batches", json={"requests": requests(1)}).json()["id"] for _ in range(5)]
    newest_first = ids[::-1]
    first = client.get("/v1/messages/batches", params={"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == newest_first[:2] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == (newest_first[0], newest_first[1])
    second = client.get("/v1/messages/batches", params={"limit": 2, "after_id": first["last_id"]}).json()
    assert [b["id"] for b in second["data"]] == newest_first[2:4] and second["has_more"]
    last = client.get("/v1/messages/batches", params={"limit": 2, "after_id": second["last_id"]}).json()
    assert [b["id"] for b in last["data"]] == newest_first[4:] and not last["has_more"]
    back = client.get("/v1/messages/batches", params={"limit": 2, "before_id": last["first_id"]}).json()
    assert [b["id"] for b in back["data"]] == newest_first[2:4] and back["has_more"]
    both = client.get("/v1/messages/batches", params={"after_id": ids[0], "before_id": ids[1]})
    assert "not both" in anthropic_error(both, 400)
    unknown = client.get("/v1/messages/batches", params={"after_id": "msgbatch_nope"})
    assert "msgbatch_nope" in anthropic_error(unknown, 400)


def test_the_openapi_document_declares_anthropics_routes_and_error_shape(client):
    doc = client.get("/openapi.json").json()
    create = doc["paths"]["/v1/messages"]["post"]
    assert create["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/AnthropicMessage")
    assert "text/event-stream" in create["responses"]["200"]["content"]
    assert "422" not in create["responses"]
    for status in ("400", "401", "404", "413", "500"):
        assert create["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/AnthropicErrorBody"
        ), status
    assert {"apiKey": []} in create["security"] and {"xApiKey": []} in create["security"]
    paths = doc["paths"]
    assert set(paths["/v1/messages/batches"]) == {"get", "post"}
    assert set(paths["/v1/messages/batches/{batch_id}"]) == {"get", "delete"}
    assert (
        "application/x-jsonl" in paths["/v1/messages/batches/{batch_id}/results"]["get"]["responses"]["200"]["content"]
    )
    assert paths["/v1/messages/count_tokens"]["post"]["responses"]["200"]["content"]["application/json"]["schema"][
        "$ref"
    ].endswith("/InputTokens")
