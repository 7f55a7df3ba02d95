"""Structured output and tool calls through a running gpuq (API and a worker as real
processes), with the official clients: the `openai` SDK's `chat.completions.parse` with a
pydantic model, JSON modes, forced and streamed tool calls and a tool result sent back; the
`ollama` client's `format` and `tools`; gpuq's own jobs API."""

import json
import time

import httpx
import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.e2e.conftest import system_on

pytestmark = system_on("sqlite")  # SQLite: the database `gpuq up` gives a user

MODEL = "smollm2-135m"
SEEDED = {"temperature": 0.7, "top_p": 0.95, "seed": 42}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


class Person(BaseModel):
    # No other keys: a schema open to any key lets a small model ramble in one past the token
    # limit on some samples (it did once flash attention moved its logits), and the test then
    # says nothing about the schema.
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def client(system):
    with openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


def _job_of(system, answer_id: str) -> dict:
    return system.client.job(answer_id.split("-", 1)[1])


def test_the_openai_sdks_parse_gives_a_pydantic_object_and_the_job_stores_its_schema(system, client):
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        max_tokens=64,
        **SEEDED,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Person) and 0 <= message.parsed.age <= 120
    job = _job_of(system, completion.id)
    assert set(job["request"]["json_schema"]["properties"]) == {"name", "age"}  # the SDK's strict schema, stored

    any_object = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=48,
        **SEEDED,
    )
    if any_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(any_object.choices[0].message.content), dict)


def test_a_required_tool_call_is_a_call_streamed_or_not_and_its_result_is_taken_back(system, client):
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=64, **SEEDED
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])

    # Streamed, as the SDK assembles the deltas: the same call (same seed, same text).
    with client.chat.completions.stream(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=64, **SEEDED
    ) as stream:
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert (streamed.function.name, json.loads(streamed.function.arguments)) == ("get_weather", arguments)

    # The call and its result sent back, as an agent does: the conversation is taken.
    history = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=24, **SEEDED)
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls
    stored = _job_of(system, reply.id)["request"]["messages"]
    assert stored[1]["tool_calls"][0]["function"]["name"] == "get_weather" and stored[2]["tool_call_id"] == call.id


def test_a_named_function_is_the_one_called_and_none_offers_no_tools(system, client):
    no_arguments = {"type": "object", "properties": {}, "additionalProperties": False}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": no_arguments}}
    named = client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[clock, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=32,
        **SEEDED,
    )
    assert named.choices[0].finish_reason == "tool_calls", named.choices[0]
    calls = named.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_time", "{}")]
    plain = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="none", max_tokens=8, **SEEDED
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")
    assert "tools" not in _job_of(system, plain.id)["request"]


# A reply the model is free to write (tool_choice auto) that holds two calls: the conversation's
# earlier answer was two calls as a JSON array, and the small model, greedy, writes it again.
TWO_CITIES = "What is the weather in Paris and in Rome?"
TWO_CALLS = json.dumps([{"name": "get_weather", "arguments": {"city": city}} for city in ("Paris", "Rome")])
CITY_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASKED_AGAIN = [
    {"role": "user", "content": TWO_CITIES},
    {"role": "assistant", "content": TWO_CALLS},
    {"role": "user", "content": TWO_CITIES},
]
GREEDY = {"temperature": 0, "max_tokens": 80}


def _cities(message) -> list[str]:
    return [json.loads(call.function.arguments)["city"] for call in message.tool_calls or []]


def test_parallel_tool_calls_false_gives_at_most_one_call_streamed_or_not(system, client):
    both = client.chat.completions.create(model=MODEL, messages=ASKED_AGAIN, tools=[CITY_WEATHER], **GREEDY)
    assert _cities(both.choices[0].message) == ["Paris", "Rome"]  # what the model writes, asked nothing

    one = client.chat.completions.create(
        model=MODEL, messages=ASKED_AGAIN, tools=[CITY_WEATHER], parallel_tool_calls=False, **GREEDY
    )
    assert _cities(one.choices[0].message) == ["Paris"] and one.choices[0].finish_reason == "tool_calls"
    job = _job_of(system, one.id)
    assert job["request"]["parallel_tool_calls"] is False
    assert len(json.loads(job["result"]["text"])) == 2  # the model wrote both again; the first is read
    assert [call["arguments"]["city"] for call in job["result"]["tool_calls"]] == ["Paris"]  # gpuq's jobs API too
    with client.chat.completions.stream(
        model=MODEL, messages=ASKED_AGAIN, tools=[CITY_WEATHER], parallel_tool_calls=False, **GREEDY
    ) as stream:
        streamed = stream.get_final_completion()
    assert _cities(streamed.choices[0].message) == ["Paris"]

    # A forced call is one call by its schema, whatever the conversation before it.
    forced = client.chat.completions.create(
        model=MODEL,
        messages=ASKED_AGAIN,
        tools=[CITY_WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    assert len(forced.choices[0].message.tool_calls or []) == 1


def test_ollamas_format_and_tools_with_its_own_client(system):
    client = ollama.Client(host=system.url, headers={"Authorization": f"Bearer {system.processes.admin_key}"})
    schema = Person.model_json_schema()
    answer = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        format=schema,
        options={"seed": 3, "num_predict": 64},
    )
    assert answer.done_reason == "stop"
    Person.model_validate_json(answer.message.content)
    generated = client.generate(model=MODEL, prompt="A colour, as JSON:", format="json", options={"num_predict": 48})
    if generated.done_reason == "stop":
        assert isinstance(json.loads(generated.response), dict)

    # Ollama has no tool_choice: with a model never taught tools, a call is up to the model;
    # what it answers is either text or calls of the tool, each in Ollama's shape.
    for stream in (False, True):
        chunks = client.chat(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], options={"seed": 3}, stream=stream)
        last = list(chunks)[-1] if stream else chunks
        assert last.done
        for call in last.message.tool_calls or []:
            assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)


def test_gpuqs_jobs_api_takes_a_schema_and_refuses_one_it_cannot_enforce(system):
    job = system.client.submit(
        {"kind": "generate", "model": MODEL, "prompt": "A person as JSON:", "json_schema": Person.model_json_schema()}
        | {"max_tokens": 64, "temperature": 0.0}
    )
    done = _finished(system, job["id"])
    assert done["status"] == "succeeded" and done["result"]["finish_reason"] == "stop"
    Person.model_validate_json(done["result"]["text"])
    headers = {"Authorization": f"Bearer {system.processes.admin_key}"}
    before = system.client.jobs(limit=1)["data"][0]["id"]
    refused = httpx.post(
        f"{system.url}/v1/jobs",
        json={"kind": "generate", "model": MODEL, "prompt": "x", "json_schema": {"not": {"type": "null"}}},
        headers=headers,
    )
    assert refused.status_code == 422 and '["not"]' in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "json_schema"
    assert system.client.jobs(limit=1)["data"][0]["id"] == before  # no job was made


def test_gpuqs_jobs_api_reads_back_a_tool_call(system):
    job = system.client.submit(
        {"kind": "generate", "model": MODEL, "messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": "required"}
        | {"max_tokens": 64, "temperature": 0.0}
    )
    done = _finished(system, job["id"])
    assert done["status"] == "succeeded"
    [call] = done["result"]["tool_calls"]
    assert call["name"] == "get_weather" and call["arguments"]["unit"] in ("celsius", "fahrenheit")
    assert json.loads(done["result"]["text"])["name"] == "get_weather"  # the model's own text is kept beside


def _finished(system, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = system.client.job(job_id)
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end")
