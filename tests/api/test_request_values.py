"""Numbers a request carries, on every route that takes them: finite, within the range their
API documents, integers bounded, booleans not read as numbers. Each a refusal in the route's
own shape before any job exists (issue 24 items 2 and 8), on both databases."""

import json

import pytest

from tests.api.conftest import redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
GEN = {"model": MODEL, "prompt": "hi", "stream": False}
INF = float("inf")
NAN = float("nan")


def post(client, path, body):
    """As a client writing JSON's non-standard NaN and Infinity (Python's parser reads them)."""
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})


@both_databases
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", CHAT | {"repeat_penalty": INF}, "repeat_penalty"),
        ("/v1/chat/completions", CHAT | {"temperature": NAN}, "temperature"),
        ("/v1/chat/completions", CHAT | {"presence_penalty": -INF}, "presence_penalty"),
        ("/v1/chat/completions", CHAT | {"top_p": 1.5}, "top_p"),
        ("/v1/chat/completions", CHAT | {"top_k": 2**70}, "top_k"),
        ("/v1/chat/completions", CHAT | {"seed": 2**70}, "seed"),
        ("/v1/chat/completions", CHAT | {"keep_alive": INF}, "keep_alive"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "frequency_penalty": 3}, "frequency_penalty"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2**70}, "max_tokens"),
        ("/v1/embeddings", {"model": MODEL, "input": ["a"] * 3000}, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": "a", "dimensions": 100_000}, "dimensions"),
    ],
)
def test_an_openai_number_out_of_range_is_a_400_naming_it_and_nothing_is_written(
    client, redis, job_rows, path, body, param
):
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert job_rows() == [] and redis_job_keys(redis) == []


@both_databases
@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/api/generate", GEN | {"options": {"repeat_penalty": NAN}}, "options.repeat_penalty"),
        ("/api/generate", GEN | {"options": {"presence_penalty": INF}}, "options.presence_penalty"),
        ("/api/generate", GEN | {"options": {"frequency_penalty": -INF}}, "options.frequency_penalty"),
        ("/api/generate", GEN | {"options": {"top_k": -5}}, "options.top_k"),
        ("/api/generate", GEN | {"options": {"top_k": 2**70}}, "options.top_k"),
        ("/api/generate", GEN | {"options": {"top_k": NAN}}, "options.top_k"),
        ("/api/generate", GEN | {"options": {"repeat_penalty": -1}}, "options.repeat_penalty"),
        ("/api/generate", GEN | {"options": {"temperature": False}}, "options.temperature"),
        ("/api/generate", GEN | {"options": {"num_predict": 2**70}}, "options.max_tokens"),
        ("/api/generate", GEN | {"keep_alive": "nan"}, "keep_alive"),
        ("/api/generate", GEN | {"keep_alive": "inf"}, "keep_alive"),
        ("/api/generate", GEN | {"keep_alive": False}, "keep_alive"),
        ("/api/chat", CHAT | {"stream": False, "options": {"top_p": 2}}, "options.top_p"),
        ("/api/embed", {"model": MODEL, "input": ["a"] * 3000}, "at most 2048"),
        ("/api/embed", {"model": MODEL, "input": "a", "dimensions": 100_000}, "dimensions is 100000"),
        ("/api/embeddings", {"model": MODEL, "prompt": "a", "keep_alive": NAN}, "keep_alive"),
    ],
)
def test_an_ollama_number_out_of_range_is_a_400_in_ollamas_shape_and_nothing_is_written(
    client, redis, job_rows, path, body, says
):
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and says in response.json()["error"]
    assert job_rows() == [] and redis_job_keys(redis) == []


@both_databases
@pytest.mark.parametrize(
    "fields",
    [{"temperature": INF}, {"repeat_penalty": NAN}, {"top_k": 2**70}, {"keep_alive": NAN}, {"top_p": True}],
)
def test_a_jobs_api_number_out_of_range_is_a_422_and_nothing_is_written(client, redis, job_rows, fields):
    job = {"kind": "generate", "model": MODEL, "prompt": "hi"} | fields
    response = post(client, "/v1/jobs", {"jobs": [job]})
    assert response.status_code == 422, response.text
    assert job_rows() == [] and redis_job_keys(redis) == []
