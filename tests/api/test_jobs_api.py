"""Submitting, reading, listing and cancelling jobs over HTTP, against real SQL and Redis."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prompt import prompt_text, unpack_prompt_ids, vocab_tokenizer, vocabulary_file_tag
from tests.api.conftest import queued_ids, redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
GEN = {"kind": "generate", "model": MODEL, "prompt": "Say hi.", "max_tokens": 8, "temperature": 0.0, "seed": 1}


@both_databases
def test_a_job_is_accepted_at_once_with_a_row_and_a_queue_entry(client, redis, job_rows):
    response = client.post("/v1/jobs", json=GEN | {"priority": "high"})
    assert response.status_code == 202
    job = response.json()
    assert job["status"] == "queued" and job["priority"] == "high" and job["id"].startswith("job_")
    assert job["prompt_tokens"] == 3  # "Say", " hi", "." by the model's own tokenizer (SmolLM2 adds no BOS)
    [row] = job_rows()
    assert (row.id, row.status, row.request["prompt"]) == (job["id"], "queued", "Say hi.")
    assert queued_ids(redis, f"gpuq:{MODEL}:generate:high:admin") == [job["id"]]
    assert client.get(f"/v1/jobs/{job['id']}").json()["request"]["max_tokens"] == 8


def test_the_prompt_is_tokenised_once_and_its_tokens_kept_for_the_worker(client, database_url, model_path):
    """The tokens the API counted go to the worker on the job row, as the worker's llama.cpp
    would make them from the rendered prompt (tests/worker/test_prompt_ids.py runs them)."""
    import llama_cpp

    chat = {k: v for k, v in GEN.items() if k != "prompt"} | {"messages": [{"role": "user", "content": "Say hi."}]}
    jobs = [client.post("/v1/jobs", json=body).json() for body in (GEN, chat)]
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:
        packed = [s.execute(select(Job.prompt_ids).where(Job.id == job["id"])).scalar_one() for job in jobs]
    engine.dispose()
    vocab = vocab_tokenizer(model_path)
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=256, verbose=False)
    for job, body, ids in zip(jobs, (GEN, chat), packed, strict=True):
        text = prompt_text(GenerationParams.model_validate(body), vocab.formatter).encode()
        assert unpack_prompt_ids(vocabulary_file_tag(model_path), ids) == llm.tokenize(text, True, True)
        assert job["prompt_tokens"] == len(llm.tokenize(text, True, True))
    llm.close()


def test_chat_messages_are_counted_with_the_models_chat_template(client):
    plain = client.post("/v1/jobs", json=GEN).json()
    chat = client.post(
        "/v1/jobs",
        json={k: v for k, v in GEN.items() if k != "prompt"} | {"messages": [{"role": "user", "content": "Say hi."}]},
    ).json()
    # The template adds a default system prompt and role markers around the same words.
    assert chat["prompt_tokens"] > plain["prompt_tokens"] + 10


def test_an_embedding_job_takes_one_text_or_a_list(client):
    one = client.post("/v1/jobs", json={"kind": "embed", "model": MODEL, "input": "hello"})
    many = client.post("/v1/jobs", json={"kind": "embed", "model": MODEL, "input": ["a", "b"]})
    assert one.status_code == many.status_code == 202
    assert client.get(f"/v1/jobs/{one.json()['id']}").json()["request"]["input"] == ["hello"]
    assert client.get(f"/v1/jobs/{many.json()['id']}").json()["request"]["input"] == ["a", "b"]


def test_the_same_idempotency_key_returns_the_first_job_and_a_different_body_is_a_conflict(client, redis, job_rows):
    first = client.post("/v1/jobs", json=GEN, headers={"Idempotency-Key": "order-17"})
    again = client.post("/v1/jobs", json=GEN, headers={"Idempotency-Key": "order-17"})
    other = client.post("/v1/jobs", json=GEN | {"prompt": "Something else"}, headers={"Idempotency-Key": "order-17"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409 and "already used for a different request" in other.json()["detail"]
    assert len(job_rows()) == 1 and len(redis_job_keys(redis)) == 1


@both_databases
def test_concurrent_retries_with_one_idempotency_key_all_get_the_first_job(client, redis, job_rows):
    noop = {"kind": "noop", "model": MODEL}
    with ThreadPoolExecutor(max_workers=8) as pool:
        sent = pool.map(lambda _: client.post("/v1/jobs", json=noop, headers={"Idempotency-Key": "storm-1"}), range(8))
        responses = list(sent)
    assert sorted(r.status_code for r in responses) == [200] * 7 + [202], [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(job_rows()) == 1 and len(redis_job_keys(redis)) == 1


@both_databases
def test_bulk_submission_is_all_or_nothing(client, redis, job_rows):
    good = client.post(
        "/v1/jobs/bulk", json={"jobs": [GEN, GEN | {"priority": "low"}, {"kind": "noop", "model": MODEL}]}
    )
    assert good.status_code == 202 and [j["status"] for j in good.json()["data"]] == ["queued"] * 3
    bad = client.post("/v1/jobs/bulk", json={"jobs": [GEN, GEN | {"model": "missing"}]})
    assert bad.status_code == 404 and bad.json()["detail"].startswith("jobs[1]: model 'missing'")
    assert len(job_rows()) == 3 and len(redis_job_keys(redis)) == 3


BAD_INPUTS = [
    ({"kind": "generate", "model": "missing", "prompt": "x"}, 404, "model 'missing' is not registered"),
    ({"kind": "generate", "model": MODEL, "prompt": ""}, 422, "prompt: String should have at least 1 character"),
    ({"kind": "generate", "model": MODEL}, 422, "give exactly one of `prompt` (text), `messages` (chat) or"),
    ({"kind": "generate", "model": MODEL, "messages": []}, 422, "messages: List should have at least 1 item"),
    ({"kind": "generate", "model": MODEL, "prompt": "x", "max_tokens": 0}, 422, "max_tokens: Input should be greater"),
    (GEN | {"max_tokens": 5000}, 422, "max_tokens is 5000 but 'smollm2-135m' has a context of 2048 tokens"),
    (GEN | {"prompt": "word " * 2100}, 422, "the prompt is 2101 tokens and max_tokens is 8, 2109 in all"),
    (GEN | {"temperature": 3}, 422, "temperature: Input should be less than or equal to 2"),
    (GEN | {"priority": "urgent"}, 422, "priority: unknown priority 'urgent'; use one of: high, normal, low"),
    (GEN | {"stop": ["a"] * 5}, 422, "stop: List should have at most 4 items"),
    (GEN | {"colour": "red"}, 422, "colour: Extra inputs are not permitted"),
    ({"kind": "translate", "model": MODEL}, 422, "does not match any of the expected tags"),
    ({"kind": "embed", "model": MODEL, "input": []}, 422, "`input` is an empty list"),
    ({"kind": "embed", "model": MODEL, "input": ["ok", ""]}, 422, "`input[1]` is empty"),
    ({"kind": "embed", "model": MODEL, "input": ["word " * 2100]}, 422, "input[0] is 2101 tokens"),
]


@both_databases
@pytest.mark.parametrize(("body", "status", "message"), BAD_INPUTS)
def test_bad_jobs_get_a_clear_error_and_leave_nothing_behind(client, redis, job_rows, body, status, message):
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_malformed_json_is_a_400(client, job_rows):
    response = client.post("/v1/jobs", content=b'{"kind": "generate",', headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["detail"]
    assert job_rows() == []


def test_a_body_over_the_limit_is_refused_before_it_is_read(client, job_rows):
    response = client.post("/v1/jobs", json=GEN | {"prompt": "x" * 70_000})
    assert response.status_code == 413 and "larger than 65536 bytes" in response.json()["detail"]
    assert job_rows() == []


def test_a_wrong_kind_for_the_model_is_refused(client, settings, job_rows):
    model_file = settings.models_dir / "gen-only.gguf"
    model_file.symlink_to(client.get(f"/v1/models/{MODEL}").json()["path"])
    assert client.post("/v1/models", json={"name": "gen-only", "path": "gen-only.gguf"}).status_code == 201
    response = client.post("/v1/jobs", json={"kind": "embed", "model": "gen-only", "input": "x"})
    assert response.status_code == 422
    assert response.json()["detail"] == "model 'gen-only' cannot run embed jobs; it is for: generate"
    assert job_rows() == []


def test_an_unknown_job_is_a_404(client):
    assert client.get("/v1/jobs/job_nope").status_code == 404
    response = client.post("/v1/jobs/job_nope/cancel")
    assert response.status_code == 404 and response.json()["detail"] == "job 'job_nope' does not exist"


@both_databases
def test_cancelling_a_queued_job_removes_its_queue_entry_and_a_second_cancel_is_a_conflict(client, redis):
    job = client.post("/v1/jobs", json=GEN).json()
    response = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled" and response.json()["cancel_requested"]
    assert queued_ids(redis, f"gpuq:{MODEL}:generate:normal:admin") == [] and redis_job_keys(redis) == []
    again = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert (
        again.json()["detail"] == f"job {job['id']} is already cancelled; only queued or running jobs can be cancelled"
    )


def test_listing_filters_by_status_kind_and_priority_and_pages(client):
    ids = [client.post("/v1/jobs", json=GEN | {"priority": p}).json()["id"] for p in ("high", "low", "low")]
    embed = client.post("/v1/jobs", json={"kind": "embed", "model": MODEL, "input": "x"}).json()["id"]
    client.post(f"/v1/jobs/{ids[0]}/cancel")
    assert [j["id"] for j in client.get("/v1/jobs", params={"status": "cancelled"}).json()["data"]] == [ids[0]]
    assert [j["id"] for j in client.get("/v1/jobs", params={"kind": "embed"}).json()["data"]] == [embed]
    low = client.get("/v1/jobs", params={"priority": "low"}).json()["data"]
    assert [j["id"] for j in low] == [ids[2], ids[1]]
    page = client.get("/v1/jobs", params={"limit": 2}).json()
    assert page["has_more"] and [j["id"] for j in page["data"]] == [embed, ids[2]]
    rest = client.get("/v1/jobs", params={"limit": 2, "after": page["next_after"]}).json()
    assert not rest["has_more"] and [j["id"] for j in rest["data"]] == [ids[1], ids[0]]
    assert "result" not in page["data"][0]  # lists stay small; GET one job for its result


def test_listing_refuses_bad_filters_clearly(client):
    assert "unknown priority 'top'" in client.get("/v1/jobs", params={"priority": "top"}).json()["detail"]
    assert client.get("/v1/jobs", params={"status": "done"}).status_code == 422
    naive = client.get("/v1/jobs", params={"created_after": "2026-01-01T00:00:00"})
    assert naive.status_code == 422 and "need a time zone" in naive.json()["detail"]
    assert "which does not exist" in client.get("/v1/jobs", params={"after": "job_x"}).json()["detail"]
