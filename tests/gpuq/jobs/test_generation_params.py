"""A generation's request goes from its producer to the worker typed: stored in one shape and
read back as the same object, without being validated again, and rows stored by earlier
versions read back as the worker always read them."""

import json

import pytest
from pydantic import ValidationError

from gpuq.db.tables import JobKind
from gpuq.jobs.generation_params import GenerationParams, generation
from gpuq.jobs.request import ChatMessage, EmbeddingParams, JobParams, ResponseFields
from gpuq.jobs.submit import JobSpec
from gpuq.queue_names import Priority

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}

# What the producers build: each shape of prompt, and each field the engine reads.
PRODUCED = [
    {"prompt": "Say hi.", "max_tokens": 8, "temperature": 0.0, "seed": 1, "stop": ["\n"], "n": 3},
    {"prompt_token_ids": [1, 2, 3], "max_tokens": 4, "logprobs": 2, "echo": True, "endpoint": "/v1/completions"},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "content": "-3C", "tool_call_id": "c1", "name": "weather"},
        ],
        "max_tokens": 50,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "events": "tokens",
        "keep_alive": 30.0,
        "webhook_url": "https://hooks.example/x",
        "top_k": 0,
        "min_p": 0.0,
        "repeat_penalty": 1.1,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
    },
    {
        "messages": [{"role": "user", "content": "A JSON object, please."}],
        "max_tokens": 20,
        "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "response": {"instructions": True, "metadata": {"k": "v"}, "store": False, "max_output_tokens": 20},
        "events": "end",
    },
]


def _through_sql(stored: dict) -> dict:
    """A JSON column's round trip."""
    return json.loads(json.dumps(stored))


@pytest.mark.parametrize("fields", PRODUCED)
def test_what_a_producer_builds_is_what_the_worker_reads_back(fields):
    params = generation(**fields)
    stored = params.stored()
    back = GenerationParams.from_stored(_through_sql(stored))
    assert back == params
    assert back.stored() == stored  # stored in one shape, whoever writes it
    assert back.output_schema == params.output_schema
    assert back.chat() == (stored.get("messages"))  # the template gets the messages as stored
    if params.messages is not None:
        assert all(isinstance(m, ChatMessage) for m in back.messages or [])
    if params.response is not None:
        assert isinstance(back.response, ResponseFields) and back.response == params.response


def test_the_spec_carries_the_params_typed_and_its_row_stores_them_once():
    params = generation(prompt="Say hi.", max_tokens=8, n=2)
    spec = JobSpec(JobKind.GENERATE, "m", Priority.NORMAL, params)
    assert spec.generation is params and spec.request == params.stored()
    with pytest.raises(TypeError):
        _ = spec.embedding


# Rows as earlier versions stored them: before the typed request (nulls where a field now has
# a default, keys since dropped), and with keys a newer API added.
OLD_ROWS = [
    (
        {"prompt": "x", "max_tokens": 4, "n": None, "stop": None, "seed": None, "top_k": None},
        {"n": 1, "stop": [], "seed": None, "top_k": 40, "temperature": 0.8, "top_p": 0.95},
    ),
    (
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "temperature": 1.0, "events": "tokens"},
        {"temperature": 1.0, "events": "tokens", "n": 1, "logprobs": None, "echo": False},
    ),
    (
        {"prompt": "x", "max_tokens": 4, "keep_alive": 0.0, "keep_alive_shortens": True},
        {"keep_alive": 0.0, "keep_alive_shortens": True},
    ),
    (
        {"prompt": "x", "max_tokens": 4, "a_key_from_a_newer_api": 1, "messages_meta": {"x": 1}},
        {"prompt": "x", "messages": None},
    ),
]


@pytest.mark.parametrize(("row", "expected"), OLD_ROWS)
def test_a_row_stored_by_an_earlier_version_reads_back_as_the_worker_read_it(row, expected):
    params = GenerationParams.from_stored(row)
    assert {name: getattr(params, name) for name in expected} == expected
    assert params.max_new_tokens == row["max_tokens"]


def test_the_worker_does_not_validate_a_stored_row_again():
    """Its producer did: a row read back is taken as it is, even one today's API would refuse
    (a keyword it no longer enforces, say), and its schema is not compiled on the way."""
    refused_today = {"prompt": "x", "max_tokens": 4, "json_schema": {"type": "object", "not": {"type": "null"}}}
    with pytest.raises(ValidationError, match="cannot be enforced"):
        GenerationParams.model_validate(refused_today)
    assert GenerationParams.from_stored(refused_today).json_schema == refused_today["json_schema"]


def test_no_producer_can_ask_for_an_admins_keep_alive():
    """Only submit_jobs sets it, by the caller's key (tests/api: an admin's keep_alive 0 unloads)."""
    for model in (GenerationParams, JobParams):
        given = model.model_validate({"prompt": "x", "keep_alive": 0, "keep_alive_shortens": True})
        assert given.keep_alive_shortens is None and "keep_alive_shortens" not in given.stored()
    admins = generation(prompt="x", keep_alive=0).model_copy(update={"keep_alive_shortens": True})
    assert admins.stored()["keep_alive_shortens"] is True
    assert GenerationParams.from_stored(admins.stored()).keep_alive_shortens is True


def test_a_read_back_request_is_frozen():
    params = GenerationParams.from_stored({"prompt": "x", "max_tokens": 4})
    with pytest.raises(ValidationError):
        params.n = 200


def test_embedding_and_noop_rows_read_back_typed():
    grouped = {"input": ["a", [1, 2]], "custom_ids": ["x", "y"], "input_counts": [1, 1], "endpoint": "/v1/embeddings"}
    back = EmbeddingParams.from_stored(_through_sql(grouped))
    assert back == EmbeddingParams.model_validate(grouped) and back.stored() == grouped
    noop = JobParams.from_stored({"webhook_url": "https://hooks.example/x", "events": "end"})
    assert (noop.webhook_url, noop.events, noop.keep_alive) == ("https://hooks.example/x", "end", None)
