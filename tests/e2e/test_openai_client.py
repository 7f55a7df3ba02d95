"""The official `openai` client against a running gpuq (API and a worker as real processes):
chat, completions and embeddings, streamed and not, each an ordinary job in gpuq's history."""

import json
import time

import openai
import pytest

from tests.e2e.conftest import system_on

pytestmark = system_on("sqlite")  # SQLite: the database `gpuq up` gives a user

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "Name three primary colours."}]
SEEDED = {"temperature": 0.9, "top_p": 0.95, "seed": 1234}
# At temperature 0 SmolLM2 keeps counting until max_tokens: a job that runs for a long while.
COUNTING = {"model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 1500, "temperature": 0}


@pytest.fixture(scope="module")
def client(system):
    with openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.processes.admin_key, max_retries=0) as c:
        yield c


def _job_of(system, chunk_or_answer_id: str) -> dict:
    return system.client.job(chunk_or_answer_id.split("-", 1)[1])


def test_chat_streamed_gives_the_same_text_as_unstreamed_in_order_and_whole(system, client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, **SEEDED)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=20, stream=True, stream_options={"include_usage": True}, **SEEDED
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and text == whole.choices[0].message.content
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    # As it is generated, not at the end: the first token at once, then what came every 50 ms.
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    # include_usage: the last chunk (the second call took its prompt's start from the cache)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    assert all(c.usage is None for c in chunks[:-1])

    # Both are ordinary jobs: interactive calls run at high priority, and the stream carried
    # exactly the text and the tokens the job recorded.
    job = _job_of(system, chunks[0].id)
    assert job["status"] == "succeeded" and job["priority"] == "high" and job["kind"] == "generate"
    assert job["result"]["text"] == text and job["completion_tokens"] == whole.usage.completion_tokens
    assert _job_of(system, whole.id)["result"]["text"] == text


def test_a_prompt_sharing_a_long_start_reuses_it_and_says_so_with_the_same_text(system, client):
    """The second call's prompt starts as the first's (a long system prompt): its usage says
    how many prompt tokens came from the cache (OpenAI's own field), and the text is the text
    the first call gave, token for token, for the same seed."""
    system_prompt = {"role": "system", "content": "You answer in one short sentence. " * 24}
    messages = [system_prompt, {"role": "user", "content": "What colour is the sky?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **SEEDED)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **SEEDED)
    assert second.choices[0].message.content == first.choices[0].message.content
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 128 <= cached < second.usage.prompt_tokens  # whole chunks of the shared start, never the last token
    assert _job_of(system, second.id)["cached_tokens"] == cached


def test_completions_streamed_and_not_and_the_priority_header(system, client):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(**body, extra_headers={"X-Gpuq-Priority": "low"})
    streamed = list(client.completions.create(**body, stream=True))
    assert whole.object == "text_completion" and whole.choices[0].text
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert _job_of(system, whole.id)["priority"] == "low"


def test_service_tier_sets_the_priority_and_is_echoed_as_openai_does(system, client):
    """flex runs at low priority, priority at high, default and auto at the key's (high for an
    interactive call by default); each answer, and each streamed chunk, names the tier."""
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "temperature": 0}
    flex = client.chat.completions.create(**body, service_tier="flex")
    auto = client.chat.completions.create(**body, service_tier="auto")
    streamed = list(client.chat.completions.create(**body, service_tier="priority", stream=True))
    plain = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"service_tier": "flex"})
    untiered = client.chat.completions.create(**body)

    assert (flex.service_tier, _job_of(system, flex.id)["priority"]) == ("flex", "low")
    assert (auto.service_tier, _job_of(system, auto.id)["priority"]) == ("default", "high")
    assert {c.service_tier for c in streamed} == {"priority"} and _job_of(system, streamed[0].id)["priority"] == "high"
    assert (getattr(plain, "service_tier", None), _job_of(system, plain.id)["priority"]) == ("flex", "low")
    assert untiered.service_tier is None  # not asked for: not named
    with pytest.raises(openai.BadRequestError, match="give one of them"):
        client.chat.completions.create(**body, service_tier="flex", extra_headers={"X-Gpuq-Priority": "high"})


def test_embeddings_of_a_list_as_floats_and_base64(system, client):
    texts = ["The cat sat on the mat.", "Interest rates rose in March."]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    packed = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in floats.data] == [0, 1] and len(floats.data[0].embedding) == 576
    for a, b in zip(floats.data, packed.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)  # float32 on the wire
    assert floats.usage.prompt_tokens > 0 and floats.model == MODEL
    short = client.embeddings.create(model=MODEL, input=texts[0], dimensions=64, encoding_format="float")
    assert len(short.data[0].embedding) == 64
    assert sum(x * x for x in short.data[0].embedding) == pytest.approx(1.0)


def test_models_and_files_list_and_delete(system, client, tmp_path):
    assert MODEL in [m.id for m in client.models.list()]
    path = tmp_path / "lines.jsonl"
    body = {"model": MODEL, "input": "hello"}
    path.write_text(f'{{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {json.dumps(body)}}}\n')
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    assert uploaded.id in [f.id for f in client.files.list()]
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    assert uploaded.id not in [f.id for f in client.files.list(purpose="batch_output")]
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    assert uploaded.id not in [f.id for f in client.files.list()]
    with pytest.raises(openai.NotFoundError, match=uploaded.id):
        client.files.retrieve(uploaded.id)


def test_refusals_raise_the_clients_own_errors_with_gpuqs_message(client):
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="context of 2048 tokens") as too_long:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5000)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="less than or equal to 128") as many:
        client.chat.completions.create(model=MODEL, messages=QUESTION, n=500)
    assert many.value.param == "n"
    unique = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError, match="uniqueItems") as unenforceable:
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            response_format={"type": "json_schema", "json_schema": {"name": "ids", "schema": unique}},
        )
    assert unenforceable.value.param == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError, match="X-Gpuq-Priority"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, extra_headers={"X-Gpuq-Priority": "urgent"})
    with pytest.raises(openai.AuthenticationError, match="API key"):
        openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0).models.list()


def _wait_for(system, job_id: str, status: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = system.client.job(job_id)
        if job["status"] == status:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is {job['status']}, not {status}")


def test_a_client_that_closes_its_stream_cancels_the_job(system, client):
    stream = client.completions.create(**COUNTING, stream=True)
    first = next(iter(stream))
    assert first.choices[0].text
    job_id = first.id.split("-", 1)[1]
    assert system.client.job(job_id)["status"] == "running"
    stream.close()  # the user pressed Ctrl-C, say
    job = _wait_for(system, job_id, "cancelled")
    assert job["result"]["finish_reason"] == "cancelled" and 0 < job["completion_tokens"] < 1500


def test_a_client_that_gives_up_waiting_cancels_the_job(system, client):
    impatient = client.with_options(timeout=4.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(**COUNTING)
    [latest] = system.client.jobs(limit=1)["data"]
    job = _wait_for(system, latest["id"], "cancelled")
    assert job["request"]["prompt"] == COUNTING["prompt"] and job["completion_tokens"] < 1500
