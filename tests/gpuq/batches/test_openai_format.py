"""Batch lines with structured output and tools: the request they store, and the output
line read back from a finished job (the same bodies the OpenAI routes answer with)."""

import json
from datetime import UTC, datetime

import pytest

from gpuq.batches.openai_format import CHAT, parse_body, response_body
from gpuq.batches.responses_format import RESPONSES
from gpuq.db.tables import Job

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
ADD = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}
LINE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _stored(endpoint: str, body: dict) -> tuple[str, dict]:
    """A line's model and its request as its job row stores it."""
    model, params = parse_body(endpoint, body)
    return model, params.stored()


def test_a_line_with_a_schema_or_forced_tools_stores_the_constraint():
    _model, request = _stored(
        CHAT, LINE | {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}}
    )
    assert request["json_schema"] == SCHEMA
    _model, request = _stored(CHAT, LINE | {"response_format": {"type": "json_object"}})
    assert request["json_schema"] == {"type": "object"}
    _model, request = _stored(CHAT, LINE | {"tools": [ADD], "tool_choice": "required"})
    assert request["tools"] == [ADD] and request["tool_choice"] == "required"
    _model, request = _stored(CHAT, LINE | {"tools": [ADD], "tool_choice": "none"})
    assert "tools" not in request and "json_schema" not in request


def test_a_line_whose_schema_cannot_be_enforced_is_refused_naming_the_keyword():
    unique = {"type": "array", "uniqueItems": True}
    with pytest.raises(ValueError, match=r'body\.response_format\.json_schema\.schema: .*\["uniqueItems"\]'):
        parse_body(CHAT, LINE | {"response_format": {"type": "json_schema", "json_schema": {"schema": unique}}})


def _finished(request: dict, text: str) -> Job:
    return Job(
        id="j1",
        model="m",
        request=request,
        result={"text": text, "finish_reason": "stop"},
        created_at=datetime.now(UTC),
        prompt_tokens=5,
        completion_tokens=9,
        cached_tokens=0,
    )


def test_the_output_line_of_a_reply_that_is_a_call_carries_openais_tool_calls():
    _model, request = _stored(CHAT, LINE | {"tools": [ADD]})
    body = response_body(CHAT, _finished(request, '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'))
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call == {"id": "call_j1_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    assert json.loads(call["function"]["arguments"]) == {"a": 2}
    # Without tools the same text is an answer.
    plain = response_body(CHAT, _finished(_stored(CHAT, LINE)[1], '{"name": "add", "arguments": {"a": 2}}'))
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": '{"name": "add", "arguments": {"a": 2}}'}


def test_a_responses_line_runs_as_a_chat_job_and_its_output_line_is_a_response_object():
    add = {"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}
    line = {"model": "m", "instructions": "Be brief.", "input": "hi", "tools": [add], "metadata": {"k": "v"}}
    model, request = _stored(RESPONSES, line)
    assert model == "m" and request["tools"] == [ADD] and request["max_tokens"] == 256  # a batch line's default
    assert request["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]

    job = _finished(request, '{"name": "add", "arguments": {"a": 2}}')
    job.status = "succeeded"
    body = response_body(RESPONSES, job)
    assert (body["id"], body["object"], body["status"]) == ("resp_j1", "response", "completed")
    assert body["output"] == [
        {
            "id": "fc_j1_0",
            "type": "function_call",
            "call_id": "call_j1_0",
            "name": "add",
            "arguments": '{"a": 2}',
            "status": "completed",
        }
    ]
    assert body["instructions"] == "Be brief." and body["metadata"] == {"k": "v"} and body["tools"] == [add]
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["output_tokens"] == 9


@pytest.mark.parametrize("field", ["previous_response_id", "background", "stream"])
def test_a_responses_line_that_needs_a_live_call_is_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=rf"body\.{field}: not in batch lines"):
        parse_body(
            RESPONSES, {"model": "m", "input": "hi", field: "resp_1" if field == "previous_response_id" else True}
        )
