"""/v1/responses on the API in-process (real SQL and Redis, no worker): refusals, background
responses as jobs, what a finished one reads as (its job finished through the store, as a
worker finishes it), continuing, deleting, cancelling, and another tenant's 404s. The
live paths (a worker answering, streaming, the openai client) are in
tests/e2e/test_openai_responses.py."""

import json

import pytest

from api.schemas.responses import ResponseObject
from gpuq import store
from gpuq.db.tables import JobStatus, utcnow
from tests.api.conftest import bearer, redis_job_keys

MODEL = "smollm2-135m"
BACKGROUND = {"model": MODEL, "input": "hi", "background": True, "max_output_tokens": 16}
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}  # no grammar enforces it
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _finish(session, job_id: str, text: str, *, finish_reason: str = "stop") -> None:
    """The job ends as a worker ends it: claimed, then its outcome recorded."""
    claimed = store.claim_job(session, job_id, worker="w1", device="cpu")
    assert claimed is not None
    outcome = store.Outcome(
        job_id,
        "w1",
        JobStatus.SUCCEEDED,
        utcnow(),
        result={"text": text, "finish_reason": finish_reason},
        prompt_tokens=30,
        completion_tokens=7,
        cached_tokens=16,
        run_id=claimed.run_id,
    )
    store.record_outcomes(session, [outcome])


def _job_id(response: dict) -> str:
    return "job_" + response["id"].removeprefix("resp_")


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "tools of type 'web_search'"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "do not reason"),
        ({"truncation": "auto"}, "truncation", "'auto'"),
        ({"input": ""}, "input", "the input is empty"),
        ({"input": []}, "input", "non-empty list"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "content parts of type 'input_image'",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "items of type 'reasoning'"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "'robot'"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id", "names the call"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": UNIQUE}}},
            "text.format.schema",
            'the keyword(s) ["uniqueItems"] cannot be enforced',
        ),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "text, json_object or json_schema"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "cannot be made shorter"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "give the JSON schema"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice", "'other'"),
        ({"tools": [WEATHER | {"name": ""}]}, "tools[0].name", "needs a name"),
        ({"include": ["file_search_call.results"]}, "include[0]", "'file_search_call.results'"),
        ({"top_logprobs": 3}, "top_logprobs", "needs include"),
        ({"store": False}, "store", "background responses must be stored"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "stored prompt templates"),
        ({"conversation": "conv_1"}, "conversation", "the Conversations API"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 pairs"),
        ({"max_output_tokens": 9999}, "max_output_tokens", "has a context of 2048 tokens"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"frobnicate": 1}, "frobnicate", "unrecognized request argument"),
    ],
)
def test_a_request_gpuq_cannot_honour_is_a_400_naming_the_parameter_and_queues_nothing(
    client, redis, job_rows, body, param, message
):
    response = client.post("/v1/responses", json=BACKGROUND | body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_an_unknown_model_or_previous_response_is_a_404_and_queues_nothing(client, redis, job_rows):
    model = client.post("/v1/responses", json=BACKGROUND | {"model": "nope"})
    assert model.status_code == 404 and model.json()["error"]["code"] == "model_not_found"
    previous = client.post("/v1/responses", json=BACKGROUND | {"previous_response_id": "resp_missing"})
    assert previous.status_code == 404, previous.text
    assert previous.json()["error"]["code"] == "previous_response_not_found"
    assert previous.json()["error"]["param"] == "previous_response_id"
    assert job_rows() == [] and redis_job_keys(redis) == []


@pytest.mark.parametrize(
    ("tier", "echoed", "priority"),
    [("flex", "flex", "low"), ("priority", "priority", "high"), ("auto", "default", "normal"), (None, None, "normal")],
)
def test_service_tier_sets_a_responses_priority_and_is_named_back_on_every_read(client, tier, echoed, priority):
    """flex runs at low priority, priority at high, auto and default at the key's (a background
    response's, with no key default: normal); the response names the tier it asked for."""
    created = client.post("/v1/responses", json=BACKGROUND | ({"service_tier": tier} if tier else {}))
    assert created.status_code == 200, created.text
    response = created.json()
    assert response["service_tier"] == echoed
    assert client.get(f"/v1/jobs/{_job_id(response)}").json()["priority"] == priority
    assert client.get(f"/v1/responses/{response['id']}").json()["service_tier"] == echoed


def test_a_service_tier_and_a_priority_header_that_disagree_are_a_400(client, job_rows):
    refused = client.post(
        "/v1/responses", json=BACKGROUND | {"service_tier": "flex"}, headers={"X-Gpuq-Priority": "high"}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "service_tier"
    assert job_rows() == []


def test_a_background_response_is_queued_at_once_as_an_ordinary_job_and_reads_back_as_asked(client):
    body = BACKGROUND | {
        "instructions": "Answer briefly.",
        "metadata": {"ticket": "T-1"},
        "temperature": 0.5,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_object"}},
    }
    created = client.post("/v1/responses", json=body)
    assert created.status_code == 200, created.text
    response = created.json()
    assert response["id"].startswith("resp_") and response["status"] == "queued" and response["background"]
    assert created.headers["X-Gpuq-Job-Id"] == _job_id(response)
    assert (response["instructions"], response["metadata"], response["temperature"]) == (
        "Answer briefly.",
        {"ticket": "T-1"},
        0.5,
    )
    assert response["tools"] == [WEATHER] and response["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert response["text"] == {"format": {"type": "json_object"}}
    assert response["output"] == [] and response["usage"] is None and response["max_output_tokens"] == 16

    # The response is its job: in gpuq's own API, at normal priority (nobody waits on it).
    job = client.get(f"/v1/jobs/{_job_id(response)}").json()
    assert job["status"] == "queued" and job["priority"] == "normal" and job["kind"] == "generate"
    assert job["request"]["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "hi"},
    ]
    assert client.get(f"/v1/responses/{response['id']}").json() == response


def test_a_finished_response_reads_as_completed_or_incomplete_with_its_usage(client, session):
    done = client.post("/v1/responses", json=BACKGROUND).json()
    cut = client.post("/v1/responses", json=BACKGROUND).json()
    _finish(session, _job_id(done), "Hello there.")
    _finish(session, _job_id(cut), "Hello th", finish_reason="length")

    completed = client.get(f"/v1/responses/{done['id']}").json()
    assert completed["status"] == "completed" and completed["incomplete_details"] is None
    [message] = completed["output"]
    assert (message["type"], message["role"], message["status"]) == ("message", "assistant", "completed")
    assert message["content"] == [{"type": "output_text", "text": "Hello there.", "annotations": [], "logprobs": []}]
    assert completed["usage"] == {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 16},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 37,
    }
    for shown in (done, completed):  # as the OpenAPI document declares it
        ResponseObject.model_validate(shown)
    incomplete = client.get(f"/v1/responses/{cut['id']}").json()
    assert incomplete["status"] == "incomplete" and incomplete["incomplete_details"] == {"reason": "max_output_tokens"}
    assert incomplete["output"][0]["status"] == "incomplete"


def test_a_call_continued_with_its_output_carries_the_conversation_but_not_the_instructions(client, session):
    first = client.post(
        "/v1/responses",
        json=BACKGROUND | {"instructions": "Use tools.", "input": "Weather in Paris?", "tools": [WEATHER]},
    ).json()
    _finish(session, _job_id(first), '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    [call] = client.get(f"/v1/responses/{first['id']}").json()["output"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call",
        "get_weather",
        {"city": "Paris"},
    )

    output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"celsius": 21}'}
    second = client.post(
        "/v1/responses", json=BACKGROUND | {"previous_response_id": first["id"], "input": [output], "tools": [WEATHER]}
    ).json()
    assert second["previous_response_id"] == first["id"] and second["instructions"] is None
    messages = client.get(f"/v1/jobs/{_job_id(second)}").json()["request"]["messages"]
    assert messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": '{"celsius": 21}', "tool_call_id": call["call_id"], "name": "get_weather"},
    ]
    items = client.get(f"/v1/responses/{second['id']}/input_items", params={"order": "asc"}).json()
    assert [i["type"] for i in items["data"]] == ["message", "function_call", "function_call_output"]
    assert items["data"][1]["call_id"] == items["data"][2]["call_id"] == call["call_id"]
    assert items["has_more"] is False and items["first_id"] == items["data"][0]["id"]
    newest = client.get(f"/v1/responses/{second['id']}/input_items", params={"limit": 1}).json()
    assert [i["type"] for i in newest["data"]] == ["function_call_output"] and newest["has_more"] is True
    rest = client.get(f"/v1/responses/{second['id']}/input_items", params={"after": newest["last_id"]}).json()
    assert [i["type"] for i in rest["data"]] == ["function_call", "message"]


def test_a_response_still_queued_cannot_be_continued_or_deleted_and_is_cancelled(client, job_rows):
    queued = client.post("/v1/responses", json=BACKGROUND).json()
    continued = client.post("/v1/responses", json=BACKGROUND | {"previous_response_id": queued["id"]})
    assert continued.status_code == 400 and "is queued" in continued.json()["error"]["message"]
    deleted = client.delete(f"/v1/responses/{queued['id']}")
    assert deleted.status_code == 409 and "cancel it first" in deleted.json()["error"]["message"]
    assert len(job_rows()) == 1

    cancelled = client.post(f"/v1/responses/{queued['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.post(f"/v1/responses/{queued['id']}/cancel").json()["status"] == "cancelled"  # again: as it is
    assert client.get(f"/v1/jobs/{_job_id(queued)}").json()["status"] == "cancelled"


def test_deleting_a_response_forgets_its_texts_and_keeps_its_job_and_figures(client, session):
    response = client.post("/v1/responses", json=BACKGROUND | {"input": "my secret", "metadata": {"a": "b"}}).json()
    _finish(session, _job_id(response), "a secret answer")
    deleted = client.delete(f"/v1/responses/{response['id']}")
    assert deleted.status_code == 200 and deleted.json() == {
        "id": response["id"],
        "object": "response",
        "deleted": True,
    }
    for path in ("", "/input_items"):
        assert client.get(f"/v1/responses/{response['id']}{path}").status_code == 404
    again = client.post("/v1/responses", json=BACKGROUND | {"previous_response_id": response["id"]})
    assert again.status_code == 404
    job = client.get(f"/v1/jobs/{_job_id(response)}").json()
    assert job["status"] == "succeeded" and (job["prompt_tokens"], job["completion_tokens"]) == (30, 7)
    assert "secret" not in json.dumps(job)


def test_another_tenants_response_is_a_404_everywhere(client, make_key, session):
    response = client.post("/v1/responses", json=BACKGROUND).json()
    _finish(session, _job_id(response), "mine")
    other = bearer(make_key(owner="someone-else"))
    rid = response["id"]
    for method, path in (
        ("GET", f"/v1/responses/{rid}"),
        ("GET", f"/v1/responses/{rid}/input_items"),
        ("POST", f"/v1/responses/{rid}/cancel"),
        ("DELETE", f"/v1/responses/{rid}"),
    ):
        answer = client.request(method, path, headers=other)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "response_not_found", path
    continued = client.post("/v1/responses", json=BACKGROUND | {"previous_response_id": rid}, headers=other)
    assert continued.status_code == 404
    assert client.get(f"/v1/responses/{rid}").json()["status"] == "completed"  # untouched


def test_a_finished_responses_events_are_rebuilt_from_its_row_and_resume_after_a_number(client, session):
    response = client.post("/v1/responses", json=BACKGROUND).json()
    _finish(session, _job_id(response), "Hello there.")

    def events(**params) -> list[dict]:
        with client.stream("GET", f"/v1/responses/{response['id']}", params={"stream": "true", **params}) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
        return [json.loads(line.removeprefix("data: ")) for line in lines]

    whole = events()
    assert [e["type"] for e in whole] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in whole] == list(range(9))
    assert whole[4]["delta"] == whole[5]["text"] == "Hello there."
    assert whole[-1]["response"]["output"] == client.get(f"/v1/responses/{response['id']}").json()["output"]
    assert events(starting_after=5) == whole[6:]
