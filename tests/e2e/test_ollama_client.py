"""The official `ollama` client against a running gpuq (API and a worker as real processes):
generate, chat, embed, the model routes, Ollama's errors, each call an ordinary job."""

import json
import time
from datetime import UTC, datetime, timedelta

import httpx
import ollama
import pytest

from tests.e2e.conftest import system_on

pytestmark = system_on("sqlite")  # SQLite: the database `gpuq up` gives a user

MODEL = "smollm2-135m"
SEEDED = {"temperature": 0.9, "top_p": 0.95, "seed": 4321, "num_predict": 16}
DURATIONS = ("total_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def client(system):
    # The ollama client sends no key by default; gpuq's keys go in the Authorization header.
    return ollama.Client(host=system.url, headers={"Authorization": f"Bearer {system.processes.admin_key}"})


def _latest_job(system) -> dict:
    [latest] = system.client.jobs(limit=1)["data"]
    return system.client.job(latest["id"])


def test_generate_streamed_and_not_give_the_same_text_with_ollamas_metrics(system, client):
    whole = client.generate(model=MODEL, prompt="Why is the sky blue?", options=SEEDED, stream=False)
    job = _latest_job(system)
    parts = list(client.generate(model=MODEL, prompt="Why is the sky blue?", options=SEEDED, stream=True))
    assert whole.response and "".join(p.response for p in parts) == whole.response
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and len(parts) > 2
    assert parts[-1].done_reason == whole.done_reason == "length"  # num_predict reached
    # Ollama's figures: token counts as the job recorded them (the prompt's tokens evaluated,
    # not those reused from the cache), durations in nanoseconds.
    assert whole.eval_count == job["completion_tokens"] == 16
    assert whole.prompt_eval_count == job["prompt_tokens"] - job["cached_tokens"] > 0
    for name in DURATIONS:
        assert isinstance(whole[name], int) and whole[name] > 1_000_000  # more than a millisecond, in ns
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration
    assert job["result"]["text"] == whole.response and job["priority"] == "high"
    assert job["request"]["messages"][-1] == {"role": "user", "content": "Why is the sky blue?"}  # the chat template


def test_chat_streamed_and_not_and_a_raw_generate(system, client):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    whole = client.chat(model=MODEL, messages=messages, options=SEEDED, stream=False)
    parts = list(client.chat(model=MODEL, messages=messages, options=SEEDED, stream=True))
    assert whole.message.role == "assistant" and whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count
    raw = client.generate(model=MODEL, prompt="1, 2, 3,", raw=True, options={"num_predict": 4, "temperature": 0})
    assert raw.response and _latest_job(system)["request"]["prompt"] == "1, 2, 3,"
    # Over HTTP a request that says nothing about streaming streams, as Ollama's server does.
    headers = {"Authorization": f"Bearer {system.processes.admin_key}"}
    body = {"model": MODEL, "messages": messages, "options": SEEDED}
    with httpx.stream("POST", f"{system.url}/api/chat", json=body, headers=headers, timeout=120) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert "".join(line["message"]["content"] for line in lines) == whole.message.content and lines[-1]["done"]


def test_embed_a_list_and_the_older_embeddings_route(client):
    texts = ["The cat sat on the mat.", "Interest rates rose in March."]
    out = client.embed(model=MODEL, input=texts)
    assert len(out.embeddings) == 2 and len(out.embeddings[0]) == 576 and out.prompt_eval_count > 0
    assert sum(x * x for x in out.embeddings[0]) == pytest.approx(1.0)
    older = client.embeddings(model=MODEL, prompt=texts[0])
    assert older.embedding == pytest.approx(out.embeddings[0], abs=1e-6)
    short = client.embed(model=f"{MODEL}:latest", input=texts[0], dimensions=32)  # Ollama's tag is taken too
    assert len(short.embeddings[0]) == 32


def test_models_listed_shown_and_loaded_with_keep_alive_honoured(system, client):
    [listed] = [m for m in client.list().models if m.model == f"{MODEL}:latest"]
    assert listed.details.format == "gguf" and listed.details.quantization_level == "Q4_1" and listed.size > 0
    shown = client.show(MODEL)
    assert set(shown.capabilities) == {"completion", "embedding"} and "im_start" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama"

    client.generate(model=MODEL, prompt="Hi", options={"num_predict": 1}, keep_alive="10m")
    assert _latest_job(system)["request"]["keep_alive"] == 600
    deadline = time.monotonic() + 15  # the worker publishes expiry times between jobs
    while time.monotonic() < deadline:
        loaded = [m for m in client.ps().models if m.model == f"{MODEL}:latest"]
        if loaded and loaded[0].expires_at:
            break
        time.sleep(0.2)
    left = loaded[0].expires_at - datetime.now(UTC)
    assert timedelta(minutes=9) < left <= timedelta(minutes=10) and loaded[0].context_length == 2048

    # keep_alive 0 unloads right after the call (embedding and generation are two instances).
    client.embed(model=MODEL, input="Hi", keep_alive=0)
    client.generate(model=MODEL, prompt="Hi", options={"num_predict": 1}, keep_alive=0)
    deadline = time.monotonic() + 15
    while any(m.model == f"{MODEL}:latest" for m in client.ps().models) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(m.model == f"{MODEL}:latest" for m in client.ps().models)


def test_a_submitters_keep_alive_never_unloads_or_shortens_what_others_rely_on(system, client):
    """Only an admin's keep_alive may bring a model's unloading forward (0: right after its
    job); a submitter's only lengthens its stay, and its empty-prompt unload is a 403."""
    admin = {"Authorization": f"Bearer {system.processes.admin_key}"}
    made = httpx.post(f"{system.url}/v1/keys", json={"name": "tenant", "owner": "acme"}, headers=admin, timeout=30)
    tenant = ollama.Client(host=system.url, headers={"Authorization": f"Bearer {made.json()['key']}"})
    one_token = {"num_predict": 1}

    def expiry_after(job_id: str) -> datetime | None:
        """The model's expiry once the worker has published what this job left (None: not loaded)."""
        wait_for_job = time.monotonic() + 30
        while system.client.job(job_id)["status"] in ("queued", "running") and time.monotonic() < wait_for_job:
            time.sleep(0.1)
        time.sleep(1.0)  # the worker publishes its loaded models between jobs
        loaded = [m for m in client.ps().models if m.model == f"{MODEL}:latest"]
        return loaded[0].expires_at if loaded else None

    client.generate(model=MODEL, prompt="Hi", options=one_token, keep_alive="10m")
    relied_on = expiry_after(_latest_job(system)["id"])
    assert relied_on is not None and relied_on - datetime.now(UTC) > timedelta(minutes=9)
    for keep_alive in (0, "1m"):
        tenant.generate(model=MODEL, prompt="Hi", options=one_token, keep_alive=keep_alive)
        now = expiry_after(_latest_job(system)["id"])
        assert now is not None and now >= relied_on - timedelta(seconds=1), (keep_alive, now, relied_on)
    with pytest.raises(ollama.ResponseError) as unload:
        tenant.generate(model=MODEL, prompt="", keep_alive=0)
    assert unload.value.status_code == 403 and any(m.model == f"{MODEL}:latest" for m in client.ps().models)

    tenant.generate(model=MODEL, prompt="Hi", options=one_token, keep_alive="20m")  # longer: taken
    lengthened = expiry_after(_latest_job(system)["id"])
    assert lengthened is not None and lengthened - datetime.now(UTC) > timedelta(minutes=19)
    assert _latest_job(system)["request"]["keep_alive"] == 1200  # as the tenant sent it

    client.generate(model=MODEL, prompt="Hi", options=one_token, keep_alive=0)  # an admin's 0 unloads
    assert expiry_after(_latest_job(system)["id"]) is None


def test_refusals_are_ollamas_errors(system, client):
    with pytest.raises(ollama.ResponseError) as missing:
        client.generate(model="no-such-model", prompt="hi")
    assert missing.value.status_code == 404 and missing.value.error == "model 'no-such-model' not found"
    with pytest.raises(ollama.ResponseError) as too_long:
        client.generate(model=MODEL, prompt="hi", options={"num_predict": 5000})
    assert too_long.value.status_code == 400 and "context of 2048 tokens" in too_long.value.error
    with pytest.raises(ollama.ResponseError) as wide:
        client.generate(model=MODEL, prompt="hi", options={"num_ctx": 8192})
    assert wide.value.status_code == 400 and "num_ctx is 8192" in wide.value.error
    with pytest.raises(ollama.ResponseError) as narrow:
        client.generate(model=MODEL, prompt="hi " * 40, options={"num_ctx": 32, "num_predict": 8})
    assert "num_ctx is 32" in narrow.value.error
    unenforceable = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    with pytest.raises(ollama.ResponseError) as json_mode:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], format=unenforceable)
    assert json_mode.value.status_code == 400 and 'format: the keyword(s) ["not"]' in json_mode.value.error
    with pytest.raises(ollama.ResponseError) as pulled:
        client.pull("llama3.2")
    assert "gpuq does not pull models" in pulled.value.error and MODEL in pulled.value.error
    assert client.pull(MODEL).status == "success"  # registered: nothing to pull
    with pytest.raises(ollama.ResponseError) as keyless:
        ollama.Client(host=system.url).list()
    assert keyless.value.status_code == 401 and "API key" in keyless.value.error
