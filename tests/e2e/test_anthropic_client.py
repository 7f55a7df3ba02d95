"""The official `anthropic` client against a running gpuq (API, a worker and the scheduler as
real processes): messages, their stream, count_tokens, a tool-use round trip and a Message
Batch, each request an ordinary job in gpuq's history."""

import json
import time

import anthropic
import pytest

from tests.e2e.conftest import system_on

pytestmark = system_on("sqlite")  # SQLite: the database `gpuq up` gives a user; the SQL is the batch engine's

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "Name three primary colours."}]
GREEDY = {"extra_body": {"temperature": 0.0}}  # the SDK no longer types sampling fields; gpuq takes them
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    # maxLength: enforced too, so the forced call ends within max_tokens whatever the model writes
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(system):
    system.processes.start_scheduler()  # it ends the Message Batch
    with anthropic.Anthropic(base_url=system.url, api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


def _job(system, message_id: str) -> dict:
    return system.client.job(message_id.removeprefix("msg_"))


def test_a_message_and_its_stream_give_the_same_text_and_are_gpuq_jobs(system, client):
    whole = client.messages.create(model=MODEL, max_tokens=20, messages=QUESTION, **GREEDY)
    assert whole.type == "message" and whole.role == "assistant" and whole.content[0].type == "text"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens > 0
    job = _job(system, whole.id)
    assert job["status"] == "succeeded" and job["priority"] == "high" and job["result"]["text"] == whole.content[0].text
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == job["prompt_tokens"]

    with client.messages.stream(model=MODEL, max_tokens=20, messages=QUESTION, **GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 2 and "".join(pieces) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # The same prompt's tokens, evaluated or read from the worker's cache.
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_stop_sequences_say_which_one_stopped_it_and_max_tokens_is_a_stop_reason(client):
    counting = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    free = client.messages.create(model=MODEL, max_tokens=20, messages=counting, **GREEDY)
    assert free.stop_reason == "max_tokens" and free.usage.output_tokens == 20
    text = free.content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # greedy: the same text again, cut where it first occurs
    stopped = client.messages.create(model=MODEL, max_tokens=20, messages=counting, stop_sequences=[stop], **GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert "".join(block.text for block in stopped.content) == text[: text.index(stop)]


def test_an_output_format_gives_json_valid_against_its_schema(client):
    schema = {
        "type": "object",
        # Strings bounded, and greedy: a sampled answer once ran its string past max_tokens.
        "properties": {"colour": {"type": "string", "maxLength": 20}, "hex": {"type": "string", "maxLength": 10}},
        "required": ["colour", "hex"],
        "additionalProperties": False,
    }
    answer = client.messages.create(
        model=MODEL,
        max_tokens=60,
        messages=[{"role": "user", "content": "Give a colour and its hex code as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        **GREEDY,
    )
    assert answer.stop_reason == "end_turn"
    assert set(json.loads(answer.content[0].text)) == {"colour", "hex"}


def test_count_tokens_is_the_prompt_a_message_takes_and_the_priority_header_works(system, client):
    counted = client.messages.count_tokens(model=MODEL, messages=QUESTION, system="Be brief.")
    answered = client.messages.create(
        model=MODEL, max_tokens=1, messages=QUESTION, system="Be brief.", extra_headers={"X-Gpuq-Priority": "low"}
    )
    assert counted.input_tokens == answered.usage.input_tokens + answered.usage.cache_read_input_tokens
    assert _job(system, answered.id)["priority"] == "low"


def test_a_tool_use_round_trip_with_the_tool_forced(system, client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        **GREEDY,
    )
    assert first.stop_reason == "tool_use"
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input["city"], str)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees."}
    second = client.messages.create(
        model=MODEL,
        max_tokens=30,
        messages=[*ask, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}],
        tools=[WEATHER],
        **GREEDY,
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content
    rendered = _job(system, second.id)["request"]["messages"]
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool"]
    assert rendered[2] == {"role": "tool", "content": "Sunny, 24 degrees.", "tool_call_id": call.id}


def test_disable_parallel_tool_use_gives_at_most_one_tool_use_block(client):
    # The conversation's earlier answer was two calls as a JSON array; greedy, the small model
    # writes it again (tool_choice auto: the reply is the model's own).
    question = "What is the weather in Paris and in Rome?"
    two_calls = json.dumps([{"name": "get_weather", "arguments": {"city": city}} for city in ("Paris", "Rome")])
    asked_again = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": two_calls},
        {"role": "user", "content": question},
    ]

    def cities(message) -> list[str]:
        return [block.input["city"] for block in message.content if block.type == "tool_use"]

    ask = {"model": MODEL, "max_tokens": 80, "messages": asked_again, "tools": [WEATHER], **GREEDY}
    assert cities(client.messages.create(**ask)) == ["Paris", "Rome"]  # what the model writes, asked nothing
    one = {"type": "auto", "disable_parallel_tool_use": True}
    single = client.messages.create(**ask, tool_choice=one)
    assert cities(single) == ["Paris"] and single.stop_reason == "tool_use"
    with client.messages.stream(**ask, tool_choice=one) as stream:
        streamed = stream.get_final_message()
    assert cities(streamed) == ["Paris"]


def test_a_message_batch_is_created_polled_until_ended_and_read_by_custom_id(client):
    asks = {f"q{i}": f"Say the number {i}." for i in range(3)}
    batch = client.messages.batches.create(
        requests=[
            {
                "custom_id": cid,
                "params": {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": t}]},
            }
            for cid, t in asks.items()
        ]
    )
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 3
    deadline = time.monotonic() + 180
    while batch.processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
        batch = client.messages.batches.retrieve(batch.id)
    assert batch.request_counts.succeeded == 3 and batch.ended_at is not None and batch.results_url
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == set(asks)
    assert all(r.type == "succeeded" and r.message.content[0].text for r in results.values())
    assert [b.id for b in client.messages.batches.list(limit=10)] == [batch.id]
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)
