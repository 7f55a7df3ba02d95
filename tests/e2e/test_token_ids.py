"""Prompts and embedding inputs given as token ids, the tokenizer routes that make them, and
bodies without a JSON Content-Type, against a running gpuq (API and a worker as real
processes): what the worker runs from ids is what it runs from their text."""

import json

import httpx
import openai
import pytest

from tests.e2e.conftest import system_on

pytestmark = system_on("postgresql")  # PostgreSQL: results holding token ids

MODEL = "smollm2-135m"
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def client(system):
    with openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(system):
    headers = {"Authorization": f"Bearer {system.processes.admin_key}"}
    with httpx.Client(base_url=system.url, headers=headers, timeout=120) as c:
        yield c


def _tokenize(http, **body) -> dict:
    response = http.post("/tokenize", json={"model": MODEL} | body)
    assert response.status_code == 200, response.text
    return response.json()


def _job_of(system, answer_id: str) -> dict:
    return system.client.job(answer_id.split("-", 1)[1])


def test_a_completion_from_token_ids_is_the_completion_from_their_text(system, client, http):
    text = "The capital of France is"
    ids = _tokenize(http, prompt=text)["tokens"]
    from_text = client.completions.create(model=MODEL, prompt=text, **GREEDY)
    from_ids = client.completions.create(model=MODEL, prompt=ids, **GREEDY)
    from_row = client.completions.create(model=MODEL, prompt=[ids], **GREEDY)  # as lm-eval sends them
    assert from_text.choices[0].text and from_ids.choices[0].text == from_text.choices[0].text
    assert from_row.choices[0].text == from_text.choices[0].text
    assert from_ids.usage.prompt_tokens == from_text.usage.prompt_tokens == len(ids)
    job = _job_of(system, from_ids.id)
    assert job["request"]["prompt_token_ids"] == ids and "prompt" not in job["request"]
    assert job["prompt_tokens"] == len(ids)


def test_token_ids_run_as_given_with_nothing_added(system, client, http):
    """The ids of a chat prompt, rendered by hand: the completion is the chat completion's, and
    the worker counts exactly the ids sent."""
    messages = [{"role": "user", "content": "Name a primary colour."}]
    ids = _tokenize(http, messages=messages)["tokens"]
    chat = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    raw = client.completions.create(model=MODEL, prompt=ids, **GREEDY)
    assert chat.usage.prompt_tokens == raw.usage.prompt_tokens == len(ids)  # /tokenize counts what chat runs
    assert raw.choices[0].text == chat.choices[0].message.content


def test_embeddings_of_token_ids_are_the_embeddings_of_their_text(client, http):
    texts = ["The cat sat on the mat.", "Interest rates rose in March."]
    ids = [_tokenize(http, prompt=t)["tokens"] for t in texts]
    one_text = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    one_ids = client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    assert one_ids.data[0].embedding == one_text.data[0].embedding
    assert one_ids.usage.prompt_tokens == one_text.usage.prompt_tokens == len(ids[0])
    both_texts = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    both_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert [d.embedding for d in both_ids.data] == [d.embedding for d in both_texts.data]
    assert both_ids.data[0].embedding != both_ids.data[1].embedding


def test_bad_token_ids_are_the_clients_own_error_and_queue_nothing(system, client):
    before = system.client.jobs()["data"]
    with pytest.raises(openai.BadRequestError, match=r"prompt\[2\] is 50000, not a token id") as refused:
        client.completions.create(model=MODEL, prompt=[1, 2, 50000], **GREEDY)
    assert refused.value.param == "prompt"
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\[0\] is -7"):
        client.embeddings.create(model=MODEL, input=[[-7, 3]])
    assert system.client.jobs()["data"] == before


def test_ollama_generate_posted_as_curl_posts_it(http):
    """Ollama's own examples: curl -d '{...}', which says the body is a form; litellm's Ollama
    providers say nothing. Both are read as JSON, and answer as the same JSON request does."""
    body = {"model": MODEL, "prompt": "Why is the sky blue?", "stream": False, "options": {"temperature": 0}}
    body["options"]["num_predict"] = 8
    labelled = http.post("/api/generate", json=body)
    assert labelled.status_code == 200, labelled.text
    raw = json.dumps(body).encode()
    for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, {}):
        answer = http.post("/api/generate", content=raw, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["response"] == labelled.json()["response"] and answer.json()["done"] is True
