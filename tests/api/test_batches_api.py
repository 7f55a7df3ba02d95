"""Batch files and batches over HTTP: bad input is refused with line numbers and leaves nothing."""

import json

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from gpuq.batches.service import advance_batches
from gpuq.db.tables import Batch, File, Job
from tests.api.conftest import queued_ids, redis_job_keys
from tests.conftest import both_databases
from tests.metrics_parsing import samples, total

MODEL = "smollm2-135m"


def line(custom_id="a", url="/v1/chat/completions", **body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | body
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def upload(client, content: str, purpose="batch"):
    return client.post("/v1/files", files={"file": ("in.jsonl", content.encode())}, data={"purpose": purpose})


def stored_files(settings):
    return sorted(p.name for p in (settings.data_dir / "files").glob("*"))


def table(session, model):
    session.expire_all()
    return session.query(model).all()


@both_databases
def test_an_upload_is_stored_and_served_back(client, session, settings):
    content = line("a") + "\n" + line("b") + "\n"
    response = upload(client, content)
    assert response.status_code == 200, response.text
    file = response.json()
    assert file["object"] == "file" and file["purpose"] == "batch" and file["bytes"] == len(content)
    assert client.get(f"/v1/files/{file['id']}").json()["id"] == file["id"]
    assert client.get(f"/v1/files/{file['id']}/content").text == content
    assert len(table(session, File)) == 1


@pytest.mark.parametrize(
    ("content", "purpose", "message"),
    [
        (line("a") + "\n", "fine-tune", "purpose 'fine-tune' is not supported"),
        ('{"custom_id": "a"\n' + line("b"), "batch", "line 1: not valid JSON"),
        (line("a") + "\n" + line("a"), "batch", "line 2: custom_id 'a' is used twice"),
        (line("a", url="/v1/images"), "batch", "line 1: unknown endpoint '/v1/images'"),
        (json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/embeddings", "body": {}}), "batch", "must be POST"),
        ("\n\n", "batch", "the file has no lines"),
        ("[1, 2]", "batch", "line 1: each line must be a JSON object"),
    ],
)
def test_bad_uploads_are_refused_and_nothing_is_kept(client, session, settings, content, purpose, message):
    response = upload(client, content, purpose)
    assert response.status_code == 422 and message in response.json()["detail"], response.text
    assert table(session, File) == [] and stored_files(settings) == []


def test_an_upload_over_the_size_limit_is_a_413(settings):
    with TestClient(create_app(settings.model_copy(update={"max_upload_bytes": 1000}))) as small:
        response = upload(small, line("a") * 50)
    assert response.status_code == 413


def create(client, file_id, **extra):
    return client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"} | extra,
    )


@both_databases
def test_a_batch_with_invalid_lines_is_refused_whole(client, session, redis):
    content = "\n".join(
        [
            line("ok"),
            line("bad-model", model="nope"),
            line("bad-tokens", max_tokens=0),
            line("too-long", messages=[{"role": "user", "content": "word " * 2100}]),
        ]
    )
    file_id = upload(client, content).json()["id"]
    response = create(client, file_id)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("3 invalid lines: line 2: model 'nope' is not registered")
    assert "line 3: body.max_tokens: Input should be greater than or equal to 1" in detail
    assert "line 4: the prompt is" in detail
    assert table(session, Batch) == [] and redis_job_keys(redis) == []


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"input_file_id": "file-missing"}, 404, "file 'file-missing' does not exist"),
        ({"endpoint": "/v1/audio"}, 422, "endpoint: Input should be '/v1/chat/completions', '/v1/completions'"),
        ({"completion_window": "2d"}, 422, "completion_window '2d' is not supported"),
        ({"priority": "urgent"}, 422, "unknown priority 'urgent'"),
    ],
)
def test_impossible_batches_are_refused(client, session, redis, extra, status, message):
    file_id = upload(client, line("a")).json()["id"]
    response = create(client, file_id, **extra)
    assert response.status_code == status and message in response.json()["detail"], response.text
    assert table(session, Batch) == [] and redis_job_keys(redis) == []


@both_databases
def test_a_batch_is_queued_then_cancelled_then_cancelling_it_again_is_a_conflict(client, session, redis, settings):
    content = (
        "\n".join(line(f"l{i}") for i in range(3))
        + "\n"
        + json.dumps(
            {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}}
        )
    )
    batch = create(client, upload(client, content).json()["id"], webhook_url="http://hooks.example/hook").json()
    assert batch["status"] == "in_progress" and batch["request_counts"] == {"total": 4, "completed": 0, "failed": 0}
    assert len(redis_job_keys(redis)) == 4
    assert [j["priority"] for j in client.get("/v1/jobs").json()["data"]] == ["low"] * 4  # below interactive work
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel").json()
    assert cancelled["status"] == "cancelling" and cancelled["request_counts"]["failed"] == 4
    assert redis_job_keys(redis) == []
    scraped = samples(client.get("/metrics").text)  # 3 chat lines and 1 embedding group, counted as cancelled
    assert total(scraped, "gpuq_jobs_total", status="cancelled", kind="generate") == 3
    assert total(scraped, "gpuq_jobs_total", status="cancelled", kind="embed") == 1
    assert advance_batches(session, redis, settings.data_dir) == [batch["id"]]
    final = client.get(f"/v1/batches/{batch['id']}").json()
    assert final["status"] == "cancelled" and final["output_file_id"] is None and final["error_file_id"]
    errors = client.get(f"/v1/files/{final['error_file_id']}/content").text.splitlines()
    assert sorted(json.loads(e)["custom_id"] for e in errors) == ["e", "l0", "l1", "l2"]
    [delivery] = client.get("/v1/webhooks/deliveries", params={"batch_id": batch["id"]}).json()["data"]
    assert delivery["event"] == "batch.cancelled" and delivery["status"] == "pending"
    again = client.post(f"/v1/batches/{batch['id']}/cancel")
    assert again.status_code == 409 and "only a batch in progress can be cancelled" in again.json()["detail"]
    assert advance_batches(session, redis, settings.data_dir) == []  # finalised exactly once


def test_unknown_batches_and_files_are_404(client):
    assert client.get("/v1/batches/batch_nope").status_code == 404
    assert client.post("/v1/batches/batch_nope/cancel").status_code == 404
    assert client.get("/v1/files/file-nope/content").status_code == 404


def test_a_batch_past_its_window_ends_expired_and_its_waiting_lines_say_so(client, session, redis, settings):
    batch = create(client, upload(client, line("a") + "\n" + line("b")).json()["id"]).json()
    row = session.get(Batch, batch["id"])
    row.expires_at = row.created_at  # the window has run out
    session.commit()
    assert advance_batches(session, redis, settings.data_dir) == [batch["id"]]
    final = client.get(f"/v1/batches/{batch['id']}").json()
    assert final["status"] == "expired" and final["expired_at"] and final["request_counts"]["failed"] == 2
    errors = [json.loads(e) for e in client.get(f"/v1/files/{final['error_file_id']}/content").text.splitlines()]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"} and redis_job_keys(redis) == []


def test_a_webhook_url_must_be_a_url(client):
    file_id = upload(client, line("a")).json()["id"]
    assert create(client, file_id, webhook_url="not a url").status_code == 422
    job = client.post("/v1/jobs", json={"kind": "noop", "model": MODEL, "webhook_url": "ftp//x"})
    assert job.status_code == 422 and "webhook_url" in job.json()["detail"]


@both_databases
def test_a_line_retried_just_before_finalisation_keeps_the_batch_in_progress(client, session, settings):
    from gpuq.batches.service import _finalize
    from gpuq.db.tables import Job

    batch = create(client, upload(client, line("a") + "\n" + line("b") + "\n").json()["id"]).json()
    session.query(Job).filter(Job.batch_id == batch["id"]).update({"status": "failed", "error": "boom"})
    session.commit()
    # The scheduler has seen every line final; an admin's retry then requeues one before it
    # claims the batch for finalisation.
    session.query(Job).filter(Job.batch_id == batch["id"], Job.custom_id == "a").update({"status": "queued"})
    session.commit()
    row = session.get(Batch, batch["id"])
    assert _finalize(session, row, settings.data_dir) is False
    after = client.get(f"/v1/batches/{batch['id']}").json()
    assert after["status"] == "in_progress" and after["finalizing_at"] is None and after["error_file_id"] is None


def test_responses_lines_are_queued_as_chat_jobs_and_one_that_needs_a_live_call_is_refused(client, session, redis):
    body = {"model": MODEL, "instructions": "Be brief.", "input": "hi", "max_output_tokens": 4}
    responses_line = json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": body})
    batch = create(client, upload(client, responses_line).json()["id"], endpoint="/v1/responses").json()
    assert batch["status"] == "in_progress" and batch["endpoint"] == "/v1/responses"
    [listed] = client.get("/v1/jobs", params={"batch_id": batch["id"]}).json()["data"]
    request = client.get(f"/v1/jobs/{listed['id']}").json()["request"]
    assert request["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert request["endpoint"] == "/v1/responses" and request["max_tokens"] == 4

    live = json.dumps(
        {"custom_id": "p", "method": "POST", "url": "/v1/responses", "body": body | {"previous_response_id": "resp_1"}}
    )
    refused = create(client, upload(client, live).json()["id"], endpoint="/v1/responses")
    assert refused.status_code == 422 and "line 1: body.previous_response_id: not in batch lines" in refused.text
    assert len(table(session, Batch)) == 1 and len(redis_job_keys(redis)) == 1


def _family_lines() -> list[str]:
    """Four families of three lines, each family its own ~450-byte start, interleaved (the
    question first of every family, then the second), and one embedding line at the end."""
    lines = []
    for q in range(3):
        for family in range(4):
            start = f"Family {family}. " + "".join(f"Fact {i} of family {family} is here. " for i in range(14))
            lines.append(line(f"f{family}-q{q}", messages=[{"role": "user", "content": f"{start}Question {q}?"}]))
    embedding = {"model": MODEL, "input": "x"}
    lines.append(json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": embedding}))
    return lines


def _queued_custom_ids(session, redis, queue: str) -> list[str]:
    custom_id = {j.id: j.custom_id for j in table(session, Job)}
    return [custom_id[i] for i in queued_ids(redis, queue)]


@both_databases
def test_a_batch_s_lines_are_queued_by_shared_start_and_the_batch_says_how(client, session, redis):
    batch = create(client, upload(client, "\n".join(_family_lines())).json()["id"]).json()
    # No worker is up and no GPU registered: planned for the CPU default, 4 slots. Each family's
    # first line goes first, its others 4 places later, the families one after the other.
    assert batch["queue_plan"] == {"lines": 12, "groups": 4, "slots": 4}
    assert _queued_custom_ids(session, redis, f"gpuq:{MODEL}:generate:low:admin") == [
        "f0-q0", "f1-q0", "f2-q0", "f3-q0",
        "f0-q1", "f0-q2", "f1-q1", "f1-q2", "f2-q1", "f2-q2", "f3-q1", "f3-q2",
    ]  # fmt: skip
    assert _queued_custom_ids(session, redis, f"gpuq:{MODEL}:embed:low:admin") == ["e"]
    progress = client.get(f"/v1/batches/{batch['id']}/progress").json()
    assert progress["queue_plan"] == batch["queue_plan"]
    assert (progress["prompt_tokens"], progress["cached_prompt_tokens"]) == (0, 0)  # nothing has run
    # The jobs keep the file's order: each has its line's number, which the results file follows.
    by_line = {j.line_number: j.custom_id for j in table(session, Job)}
    assert by_line == {n: json.loads(x)["custom_id"] for n, x in enumerate(_family_lines(), start=1)}


def test_with_planning_off_a_batch_is_queued_in_file_order(settings, admin_key, session, redis):
    with TestClient(
        create_app(settings.model_copy(update={"batch_plan": False})), headers={"Authorization": f"Bearer {admin_key}"}
    ) as client:
        batch = create(client, upload(client, "\n".join(_family_lines())).json()["id"]).json()
        assert batch["queue_plan"] is None
        queued = _queued_custom_ids(session, redis, f"gpuq:{MODEL}:generate:low:admin")
    assert queued == [json.loads(x)["custom_id"] for x in _family_lines()][:-1]
