"""What a call that will be refused costs (issue 24 item 1): a key over its limits is refused
before its prompt is tokenised, and a conversation that cannot fit by its size alone is
refused before it is converted or tokenised; nothing is written either way."""

import pytest

from tests.api.conftest import bearer, redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}
# Fits by its size (fewer messages than the context has tokens), so only tokenising shows it is too long.
LONG_CHAT = [{"role": "user", "content": "lorem ipsum dolor sit amet " * 3} for _ in range(2_000)]


@pytest.fixture
def settings(settings):
    """gpuq's default body limit (1 MiB): the bodies here are hundreds of kilobytes."""
    return settings.model_copy(update={"max_body_bytes": 1024 * 1024})


@both_databases
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": LONG_CHAT}),
        ("/api/chat", {"model": MODEL, "messages": LONG_CHAT, "stream": False}),
        ("/v1/jobs", {"kind": "generate", "model": MODEL, "messages": LONG_CHAT, "max_tokens": 8}),
    ],
)
def test_a_key_over_its_rate_gets_its_429_before_its_prompt_is_judged(client, make_key, job_rows, redis, path, body):
    key = make_key("submitter", "acme", max_submissions_per_minute=1)
    assert client.post("/v1/jobs", json=NOOP, headers=bearer(key)).status_code == 202
    over = client.post(path, json=body, headers=bearer(key))
    assert over.status_code == 429 and int(over.headers["retry-after"]) > 0, over.text
    assert len(job_rows()) == 1 and len(redis_job_keys(redis)) == 1


@both_databases
def test_a_key_at_its_queued_jobs_limit_gets_its_429_before_its_prompt_is_judged(client, make_key, job_rows):
    key = make_key("submitter", "acme", max_queued_jobs=1)
    assert client.post("/v1/jobs", json=NOOP, headers=bearer(key)).status_code == 202
    over = client.post("/v1/chat/completions", json={"model": MODEL, "messages": LONG_CHAT}, headers=bearer(key))
    assert over.status_code == 429 and "has 1 jobs queued" in over.json()["detail"]
    assert len(job_rows()) == 1


@both_databases
@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"} for i in range(10_000)]},
            "the conversation has 10000 messages",
        ),
        (
            "/api/chat",
            {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}] * 2_048},
            "the conversation has 2048 messages",
        ),
        ("/v1/chat/completions", {"model": MODEL, "messages": LONG_CHAT}, "the prompt is at least"),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 200_000}, "the prompt is at least"),
        (
            "/v1/jobs",
            {"kind": "generate", "model": MODEL, "prompt": "x" * 200_000, "max_tokens": 8},
            "the prompt is at least",
        ),
    ],
)
def test_a_prompt_too_long_by_its_size_is_refused_with_what_to_fix(client, make_key, job_rows, path, body, says):
    key = make_key("submitter", "acme", max_submissions_per_minute=2)
    refused = client.post(path, json=body, headers=bearer(key))
    assert refused.status_code in (400, 422), refused.text
    message = refused.json().get("detail") or refused.json()["error"]
    assert says in message and "2048" in message
    assert job_rows() == []
    # nothing spent: the key's two submissions are both there
    assert client.post("/v1/jobs/bulk", json={"jobs": [NOOP, NOOP]}, headers=bearer(key)).status_code == 202
