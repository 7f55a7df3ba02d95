"""Anthropic's Messages request as the chat job gpuq runs, and a finished job as Anthropic's
message and stream events (gpuq/batches/anthropic_format.py, gpuq/dropin/anthropic.py)."""

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from gpuq.batches.anthropic_format import MessageCreate, parse_params
from gpuq.batches.anthropic_messages import message
from gpuq.db.tables import Job
from gpuq.dropin import anthropic
from gpuq.errors import RequestError
from gpuq.streams.events import Delta, End, Event, Start

MODEL = "smollm2-135m"
TOOL = {"name": "weather", "description": "the weather", "input_schema": {"type": "object"}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}


def test_a_conversation_with_a_tool_round_trip_becomes_the_chat_the_template_renders():
    body = MessageCreate.model_validate(
        {
            "model": MODEL,
            "max_tokens": 50,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, CALL]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sun"}]},
                        {"type": "text", "text": "And so?"},
                    ],
                },
            ],
            "stop_sequences": ["\n\n"],
            "top_k": 5,
            "tools": [TOOL],
            "tool_choice": {"type": "auto"},
            "metadata": {"user_id": "u1"},
        }
    )
    stored = body.to_request().stored()
    assert stored["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "content": "sun", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And so?"},
    ]
    assert stored["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "parameters": {"type": "object"}, "description": "the weather"},
        }
    ]
    assert "tool_choice" not in stored  # auto is the default
    # Anthropic's defaults: temperature 1, top_p off; the rest as given.
    assert (stored["temperature"], stored["top_p"], stored["top_k"]) == (1.0, 1.0, 5)
    assert (stored["max_tokens"], stored["stop"]) == (50, ["\n\n"])


@pytest.mark.parametrize(
    ("choice", "stored"),
    [
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "weather"}, {"type": "function", "function": {"name": "weather"}}),
    ],
)
def test_a_required_tool_choice_is_enforced_while_sampling(choice, stored):
    params = MessageCreate.model_validate(
        {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
        | {"tool_choice": choice}
    ).to_request()
    assert params.tool_choice == stored and params.output_schema is not None


@pytest.mark.parametrize("kind", ["auto", "any"])
def test_disable_parallel_tool_use_is_at_most_one_call_read_from_the_reply(kind):
    ask = {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
    one = MessageCreate.model_validate(ask | {"tool_choice": {"type": kind, "disable_parallel_tool_use": True}})
    assert one.to_request().stored()["parallel_tool_calls"] is False
    several = MessageCreate.model_validate(ask | {"tool_choice": {"type": kind, "disable_parallel_tool_use": False}})
    assert "parallel_tool_calls" not in several.to_request().stored()
    bad = MessageCreate.model_validate(ask | {"tool_choice": {"type": kind, "disable_parallel_tool_use": "yes"}})
    with pytest.raises(RequestError, match=r"tool_choice\.disable_parallel_tool_use: Input should be a valid boolean"):
        bad.to_request()
    two_calls = [{"name": "weather", "arguments": {"city": city}} for city in ("Paris", "Rome")]
    answer = job(json.dumps(two_calls), tools=True)
    assert [b["input"]["city"] for b in message(answer)["content"]] == ["Paris", "Rome"]
    answer.request = answer.request | {"parallel_tool_calls": False}
    assert [b["input"]["city"] for b in message(answer)["content"]] == ["Paris"]


def test_an_output_format_is_the_schema_the_answer_must_match():
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    params = MessageCreate.model_validate(
        {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
        | {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    ).to_request()
    assert params.json_schema == schema and params.output_schema == schema


def test_tool_choice_none_offers_no_tools():
    params = MessageCreate.model_validate(
        {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
        | {"tool_choice": {"type": "none"}}
    ).to_request()
    assert params.tools is None and params.output_schema is None


def test_a_batch_request_params_parse_to_the_same_request_or_say_what_is_wrong():
    model, params = parse_params({"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
    assert model == MODEL and params.endpoint == "/v1/messages" and params.max_tokens == 3
    with pytest.raises(ValueError, match=r"params\.max_tokens: Field required"):
        parse_params({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})


def job(text: str, *, finish: str = "stop", stop: str | None = None, tools: bool = False) -> Job:
    request = {"messages": [{"role": "user", "content": "x"}]} | (
        {"tools": [{"function": {"name": "weather"}}]} if tools else {}
    )
    result = {"text": text, "finish_reason": finish} | ({"stop_sequence": stop} if stop else {})
    return Job(
        id="job_1",
        model=MODEL,
        status="succeeded",
        request=request,
        result=result,
        prompt_tokens=20,
        completion_tokens=7,
        cached_tokens=16,
        created_at=datetime.now(UTC),
    )


@pytest.mark.parametrize(
    ("answer", "content", "reason", "stop"),
    [
        (job("Hello."), [{"type": "text", "text": "Hello."}], "end_turn", None),
        (job("Hel", finish="length"), [{"type": "text", "text": "Hel"}], "max_tokens", None),
        (job("One", stop="\n"), [{"type": "text", "text": "One"}], "stop_sequence", "\n"),
        (
            job('{"name": "weather", "arguments": {"city": "Paris"}}', tools=True),
            [{"type": "tool_use", "id": "toolu_job_1_0", "name": "weather", "input": {"city": "Paris"}}],
            "tool_use",
            None,
        ),
        (job("Just text.", tools=True), [{"type": "text", "text": "Just text."}], "end_turn", None),
    ],
)
def test_a_finished_job_is_anthropics_message(answer, content, reason, stop):
    shown = message(answer)
    assert shown["id"] == "msg_job_1" and shown["type"] == "message" and shown["role"] == "assistant"
    assert (shown["content"], shown["stop_reason"], shown["stop_sequence"]) == (content, reason, stop)
    # Cached prompt tokens are apart from those evaluated, as Anthropic counts them.
    assert shown["usage"] == {
        "input_tokens": 4, "output_tokens": 7, "cache_read_input_tokens": 16, "cache_creation_input_tokens": 0
    }  # fmt: skip


async def events(*items: Event) -> AsyncIterator[Event]:
    for item in items:
        yield item


async def streamed(answer: Job, *items: Event) -> list[tuple[str, dict]]:
    out = []
    async for chunk in anthropic.stream(events(*items), answer):
        head, data = chunk.decode().strip().split("\n")
        kind = head.removeprefix("event: ")
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == kind
        out.append((kind, body))
    return out


END = End(status="succeeded", finish_reason="stop", prompt_tokens=20, completion_tokens=2, cached_tokens=16)


async def test_a_stream_is_anthropics_events_in_order_and_its_text_joins_to_the_answer():
    out = await streamed(job("Hello there"), Start(attempt=1), Delta("Hello", 1), Delta(" there", 1), END)
    assert [kind for kind, _ in out] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert out[0][1]["message"]["id"] == "msg_job_1" and out[0][1]["message"]["content"] == []
    assert "".join(body["delta"]["text"] for kind, body in out if kind == "content_block_delta") == "Hello there"
    delta = out[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 2 and delta["usage"]["cache_read_input_tokens"] == 16


async def test_a_streamed_tool_call_is_one_tool_use_block_with_its_input_whole():
    text = '{"name": "weather", "arguments": {"city": "Paris"}}'
    out = await streamed(job(text, tools=True), Start(attempt=1), Delta(text[:10], 3), Delta(text[10:], 9), END)
    kinds = [kind for kind, _ in out]
    assert kinds[2:] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert out[2][1]["content_block"] == {"type": "tool_use", "id": "toolu_job_1_0", "name": "weather", "input": {}}
    assert json.loads(out[3][1]["delta"]["partial_json"]) == {"city": "Paris"}
    assert out[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_a_stream_that_stops_at_a_stop_sequence_names_it_and_a_failed_job_ends_with_an_error_event():
    stopped = End(status="succeeded", finish_reason="stop", stop_sequence="\n", prompt_tokens=5, completion_tokens=1)
    out = await streamed(job("One", stop="\n"), Delta("One", 1), stopped)
    assert out[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n"}
    failed = await streamed(job(""), Start(attempt=1), End(status="failed", error="out of memory"))
    assert failed[-1][0] == "error" and failed[-1][1]["error"]["type"] == "api_error"
    assert "out of memory" in failed[-1][1]["error"]["message"]
