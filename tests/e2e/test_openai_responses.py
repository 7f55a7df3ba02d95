"""The official `openai` client's Responses API against a running gpuq (API and a worker as
real processes): create, stream, background polling, resuming and cancelling, parse with a
pydantic model, and a function call answered through previous_response_id; each response
an ordinary job in gpuq's history."""

import json

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.e2e.conftest import system_on, until

pytestmark = system_on("sqlite")

MODEL = "smollm2-135m"
SEEDED = {"temperature": 0.9, "top_p": 0.95, "extra_body": {"seed": 1234}}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
# At temperature 0 SmolLM2 keeps counting until it runs out of tokens: a response that runs a while.
COUNTING = {"input": "Count from 1 to 1000: 1, 2, 3,", "max_output_tokens": 1500, "temperature": 0}


@pytest.fixture(scope="module")
def client(system):
    with openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


def _job_of(system, response_id: str) -> dict:
    return system.client.job("job_" + response_id.removeprefix("resp_"))


def test_a_streamed_response_gives_the_text_of_the_unstreamed_one_delta_by_delta(system, client):
    whole = client.responses.create(model=MODEL, input="Name three primary colours.", max_output_tokens=24, **SEEDED)
    assert whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    assert whole.usage.output_tokens_details.reasoning_tokens == 0

    with client.responses.stream(
        model=MODEL, input="Name three primary colours.", max_output_tokens=24, **SEEDED
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == whole.output_text
    assert len(deltas) >= 2  # as it is generated, not at the end
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{final.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))

    job = _job_of(system, final.id)  # an ordinary job, run at high priority: someone was waiting
    assert job["status"] == "succeeded" and job["priority"] == "high" and job["result"]["text"] == final.output_text
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_service_tier_sets_a_responses_priority_and_is_echoed_as_openai_does(system, client):
    """flex runs at low priority, priority at high, auto at the key's (high for someone waiting);
    the response, every streamed event's response and a later read name the tier."""
    body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4, "temperature": 0}
    flex = client.responses.create(**body, service_tier="flex")
    auto = client.responses.create(**body, service_tier="auto")
    events = list(client.responses.create(**body, service_tier="priority", stream=True))
    streamed = events[-1].response  # completed, or incomplete at max_output_tokens
    untiered = client.responses.create(**body)

    assert (flex.service_tier, _job_of(system, flex.id)["priority"]) == ("flex", "low")
    assert (auto.service_tier, _job_of(system, auto.id)["priority"]) == ("default", "high")
    assert streamed.service_tier == "priority" and _job_of(system, streamed.id)["priority"] == "high"
    assert {e.response.service_tier for e in events if hasattr(e, "response")} == {"priority"}
    assert client.responses.retrieve(flex.id).service_tier == "flex"
    assert untiered.service_tier is None  # not asked for: not named


def test_a_background_response_is_polled_to_its_end_and_its_events_resumed_after_a_number(client):
    queued = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, background=True, **SEEDED)
    assert queued.status in ("queued", "in_progress") and queued.background
    done = until(
        "the background response ended",
        lambda: (r := client.responses.retrieve(queued.id)).status in ("completed", "incomplete") and r,
    )
    assert done.output_text and done.usage.output_tokens > 0

    # Raw events from the server, those after number 3 (created, in_progress and the message's opening).
    resumed = list(client.responses.retrieve(queued.id, stream=True, starting_after=3))
    assert resumed[0].sequence_number == 4 and resumed[-1].type == f"response.{done.status}"
    text = "".join(e.delta for e in resumed if e.type == "response.output_text.delta")
    assert text == done.output_text


def test_a_running_background_response_is_cancelled(system, client):
    running = client.responses.create(model=MODEL, background=True, **COUNTING)
    until("the response started", lambda: client.responses.retrieve(running.id).status == "in_progress")
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(running.id).status == "cancelled"
    assert _job_of(system, running.id)["status"] == "cancelled"


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # bounded, so that a small model cannot ramble past the limit

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def test_parse_with_a_pydantic_model_answers_an_instance_of_it(system, client):
    parsed = client.responses.parse(
        model=MODEL, input="Describe a person.", text_format=Person, max_output_tokens=64, **SEEDED
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    assert json.loads(parsed.output_text) == parsed.output_parsed.model_dump()
    job = _job_of(system, parsed.id)
    assert set(job["request"]["json_schema"]["properties"]) == {"name", "age"}  # the SDK's strict schema, enforced


def test_a_function_call_answered_through_previous_response_id(system, client):
    instructions = "You are a weather assistant; answer in one short sentence. " * 12  # long: the cache serves it
    first = client.responses.create(
        model=MODEL,
        instructions=instructions,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)

    second = client.responses.create(
        model=MODEL,
        instructions=instructions,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 21, "sky": "clear"}'}],
        tools=[WEATHER],
        max_output_tokens=30,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.output_text
    assert second.usage.input_tokens_details.cached_tokens > 0  # the earlier turns' tokens came from the cache
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == items[2].call_id == call.call_id

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert _job_of(system, first.id)["status"] == "succeeded"  # the job stays in the history


def test_unstored_responses_and_refusals_raise_the_clients_own_errors(client):
    unstored = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError, match=unstored.id):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="function tools only") as built_in:
        client.responses.create(model=MODEL, input="Hi.", tools=[{"type": "web_search"}])
    assert built_in.value.param == "tools[0]"


# A reply the model is free to write (tool_choice auto) that holds two calls: the conversation's
# earlier answer was two calls as a JSON array, and the small model, greedy, writes it again.
TWO_CITIES = "What is the weather in Paris and in Rome?"
TWO_CALLS = json.dumps([{"name": "get_weather", "arguments": {"city": city}} for city in ("Paris", "Rome")])
ASKED_AGAIN = [
    {"role": "user", "content": TWO_CITIES},
    {"role": "assistant", "content": TWO_CALLS},
    {"role": "user", "content": TWO_CITIES},
]


def test_parallel_tool_calls_false_gives_at_most_one_function_call(system, client):
    def cities(**extra) -> list[str]:
        response = client.responses.create(
            model=MODEL, input=ASKED_AGAIN, tools=[WEATHER], max_output_tokens=80, temperature=0, **extra
        )
        return [json.loads(item.arguments)["city"] for item in response.output if item.type == "function_call"]

    assert cities() == ["Paris", "Rome"]  # what the model writes, asked nothing
    assert cities(parallel_tool_calls=False) == ["Paris"]
    with client.responses.stream(
        model=MODEL, input=ASKED_AGAIN, tools=[WEATHER], max_output_tokens=80, temperature=0, parallel_tool_calls=False
    ) as stream:
        final = stream.get_final_response()
    assert final.parallel_tool_calls is False
    assert [json.loads(i.arguments)["city"] for i in final.output if i.type == "function_call"] == ["Paris"]
