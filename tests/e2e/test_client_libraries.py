"""Structured output through the client libraries batch users extract with, each used as its
docs say and changed only in base URL, key and model: instructor (TOOLS, JSON, JSON_SCHEMA),
langchain-openai's `with_structured_output` (json_schema, function_calling, json_mode),
pydantic-ai's structured `output_type` and its agent loop with one tool, and litellm's `ollama_chat/` provider."""

import json
import os
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, ConfigDict

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list from GitHub

import instructor
import litellm
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import UsageLimits

from tests.e2e.conftest import system_on

MODEL = "smollm2-135m"
ASK = "Give the name and the country of one large city."
# What is checked is each library's use of the API, which no database changes: one is enough.
pytestmark = system_on("sqlite")


class City(BaseModel):
    name: str
    country: str


class AnyObject(BaseModel):
    """What JSON mode promises (`response_format: json_object`): an object, whatever its keys;
    the fields are asked for in the prompt, which a 135M model may not follow."""

    model_config = ConfigDict(extra="allow")


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON, instructor.Mode.JSON_SCHEMA])
def test_instructor_extracts_a_pydantic_object_in_each_mode(system, mode):
    client = instructor.from_openai(
        openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0), mode=mode
    )
    wanted = AnyObject if mode is instructor.Mode.JSON else City
    answer = client.chat.completions.create(
        model=MODEL,
        response_model=wanted,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=128,
        temperature=0,  # OpenAI's default is 1: a sampled answer may run past max_tokens
        max_retries=0,
    )
    assert isinstance(answer, wanted)
    if wanted is City:  # enforced: the schema (JSON_SCHEMA) or the forced tool call (TOOLS)
        assert answer.name and answer.country


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchains_with_structured_output_in_each_method(system, method):
    llm = ChatOpenAI(
        base_url=f"{system.url}/v1", api_key=system.processes.admin_key, model=MODEL, temperature=0, max_tokens=64
    )
    if method == "json_mode":  # JSON mode promises an object, not these fields: a dict schema, parsed not validated
        schema = {"title": "City", "type": "object", "properties": {"name": {"type": "string"}}}
        answer = llm.with_structured_output(schema, method=method).invoke(ASK + " Answer in JSON.")
        assert isinstance(answer, dict)
        return
    city = llm.with_structured_output(City, method=method).invoke(ASK)
    assert isinstance(city, City) and city.name and city.country


def test_pydantic_ais_structured_output_type(system):
    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=f"{system.url}/v1", api_key=system.processes.admin_key)
    )
    agent = Agent(model, output_type=City, model_settings={"max_tokens": 64, "temperature": 0.0})
    result = agent.run_sync(ASK)
    assert isinstance(result.output, City) and result.output.name and result.output.country


def test_litellms_ollama_chat_provider_with_a_json_format(system):
    answer = litellm.completion(
        model=f"ollama_chat/{MODEL}",
        api_base=system.url,
        messages=[{"role": "user", "content": ASK}],
        format="json",
        max_tokens=128,
        temperature=0,
        extra_headers={"Authorization": f"Bearer {system.processes.admin_key}"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


def test_pydantic_ais_agent_with_one_tool(system):
    """pydantic-ai's agent loop: the model's tool call runs the Python function, its return goes
    back as a `role: tool` message, and the run ends in the structured output."""
    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=f"{system.url}/v1", api_key=system.processes.admin_key)
    )
    agent = Agent(
        model,
        output_type=City,
        system_prompt="Call lookup_city first, then give its answer as the final result.",
        model_settings={"max_tokens": 96, "temperature": 0.0},
    )
    looked_up: list[str] = []

    async def until_answered(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
        """Offered until it has answered once (a 135M model would call it again and again)."""
        answered = any(part.part_kind == "tool-return" for message in ctx.messages for part in message.parts)
        return None if answered else tool

    @agent.tool_plain(prepare=until_answered)
    def lookup_city(country: Literal["France", "Japan", "Brazil"]) -> dict[str, str]:
        """The largest city of a country."""
        looked_up.append(country)
        return {"name": "Lyon", "country": country}

    result = agent.run_sync(ASK, usage_limits=UsageLimits(request_limit=4))
    assert looked_up, "the model never called the tool"
    sent_back = [part for message in result.all_messages() for part in message.parts if part.part_kind == "tool-return"]
    assert any(part.tool_name == "lookup_city" for part in sent_back)
    assert isinstance(result.output, City) and result.output.name and result.output.country
