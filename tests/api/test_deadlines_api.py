"""Deadlines over HTTP: a job says when it is needed by, is shown with it and goes first among
its tenant's jobs of its priority; a job or batch the fleet cannot finish in time is refused
(429, Retry-After, OpenAI's error shape) and nothing is stored or queued for it. The drop-in
routes (OpenAI's, Anthropic's, Ollama's) take it as the X-Gpuq-Deadline header and refuse in
their own error shapes."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from gpuq.db.tables import Batch, Job, utcnow
from gpuq.redis_keys import fair_edf_key
from tests.api.conftest import queued_ids, redis_job_keys
from tests.conftest import both_databases
from tests.metrics_parsing import samples, value

MODEL = "smollm2-135m"
NORMAL = f"gpuq:{MODEL}:generate:normal:admin"  # the admin key's tenant's queue


def slow_history(session: Session, *, tokens_per_job: int = 150, run_s: int = 250) -> None:
    """Three jobs run one after another, ending a minute ago: 450 tokens in 750 s of work,
    0.6 tokens/s; each generated half of its budget."""
    end = utcnow() - timedelta(minutes=1)
    for i in range(3):
        finished = end - timedelta(seconds=run_s * i)
        session.add(
            Job(
                id=f"done-{i}",
                kind="generate",
                model=MODEL,
                priority=1,
                status="succeeded",
                request_hash="h",
                request={"max_tokens": tokens_per_job},
                completion_budget=tokens_per_job,
                prompt_tokens=tokens_per_job // 2,
                completion_tokens=tokens_per_job // 2,
                created_at=finished - timedelta(seconds=run_s + 1),
                started_at=finished - timedelta(seconds=run_s),
                finished_at=finished,
            )
        )
    session.commit()


def job(deadline: datetime | None = None, **extra) -> dict:
    body = {"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 100} | extra
    return body | ({"deadline": deadline.isoformat()} if deadline else {})


def in_(seconds: float) -> datetime:
    return utcnow() + timedelta(seconds=seconds)


@both_databases
def test_a_job_with_a_deadline_is_shown_with_it_and_goes_first_among_its_tenants(client, redis):
    plain = client.post("/v1/jobs", json=job()).json()
    later = client.post("/v1/jobs", json=job(in_(7200))).json()
    sooner = client.post("/v1/jobs", json=job(in_(3600))).json()

    assert plain["deadline"] is None and later["deadline"] is not None
    shown = client.get(f"/v1/jobs/{sooner['id']}").json()
    assert datetime.fromisoformat(shown["deadline"]) == datetime.fromisoformat(sooner["deadline"])
    # The queue's list is the order they are given out in: deadlines first, earliest first.
    assert queued_ids(redis, NORMAL) == [sooner["id"], later["id"], plain["id"]]
    assert redis.zcard(fair_edf_key(NORMAL)) == 2
    places = {j["id"]: client.get(f"/v1/jobs/{j['id']}/position").json() for j in (plain, later, sooner)}
    assert [places[j["id"]]["position"] for j in (sooner, later, plain)] == [0, 1, 2]
    assert places[plain["id"]]["deadline"] is None and places[sooner["id"]]["deadline"] is not None
    assert places[plain["id"]]["eta_s"] is None  # nothing finished lately: no pace to judge by


@pytest.mark.parametrize(
    ("deadline", "message"),
    [("2020-01-01T00:00:00Z", "has passed"), ("2099-01-01T00:00:00", "time zone"), ("soon", "datetime")],
)
def test_a_deadline_that_is_not_a_future_time_with_a_zone_is_refused_and_nothing_queued(
    client, redis, job_rows, deadline, message
):
    response = client.post("/v1/jobs", json=job() | {"deadline": deadline})
    assert response.status_code == 422 and message in response.json()["detail"], response.text
    assert response.json()["error"]["param"] == "deadline"
    assert job_rows() == [] and redis_job_keys(redis) == []


@both_databases
def test_a_job_the_fleet_cannot_finish_by_its_deadline_is_refused_and_nothing_is_stored(
    client, session, redis, job_rows
):
    slow_history(session)  # 0.6 tokens/s; half of a budget used: this job is about 1 + 50 tokens, 85 s
    before = len(job_rows())

    refused = client.post("/v1/jobs", json=job(in_(30)))

    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "deadline_unreachable", "deadline")
    assert "would be done about" in error["message"] and refused.json()["detail"] == error["message"]
    assert 50 <= int(refused.headers["Retry-After"]) <= 60  # about 85 s of work, 30 s to spare
    assert len(job_rows()) == before and redis_job_keys(redis) == []  # nothing stored, nothing queued
    assert client.post("/v1/jobs", json=job(in_(3600))).status_code == 202  # in time: accepted


@both_databases
def test_one_late_job_of_a_bulk_request_refuses_it_all(client, session, redis, job_rows):
    slow_history(session)
    before = len(job_rows())

    refused = client.post("/v1/jobs/bulk", json={"jobs": [job(in_(3600)), job(in_(30))]})

    assert refused.status_code == 429 and refused.json()["detail"].startswith("jobs[1]: "), refused.text
    assert len(job_rows()) == before and redis_job_keys(redis) == []


def batch_file(client: TestClient, lines: int, max_tokens: int) -> str:
    content = "".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
            }
        )
        + "\n"
        for i in range(lines)
    )
    return client.post("/v1/files", files={"file": ("in.jsonl", content.encode())}, data={"purpose": "batch"}).json()[
        "id"
    ]


@both_databases
def test_a_batch_the_fleet_cannot_finish_in_its_window_is_refused_in_openais_shape(client, session, redis, admin_key):
    slow_history(session)  # 0.6 tokens/s: 3 lines of 2000 max_tokens (1000 expected each) need about 5000 s
    file_id = batch_file(client, 3, 2000)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=admin_key, http_client=client, max_retries=0)

    with pytest.raises(openai.RateLimitError) as refused:
        sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")

    assert refused.value.code == "deadline_unreachable" and refused.value.param == "completion_window"
    assert "the batch cannot be done by its deadline" in refused.value.message
    assert int(refused.value.response.headers["Retry-After"]) > 1000
    session.expire_all()
    assert session.query(Batch).count() == 0 and session.query(Job).filter(Job.batch_id.is_not(None)).count() == 0
    assert redis_job_keys(redis) == []

    accepted = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    session.expire_all()
    lines = session.query(Job).filter(Job.batch_id == accepted.id).all()
    expires = datetime.fromtimestamp(accepted.expires_at or 0).astimezone()
    assert len(lines) == 3 and all(abs((j.deadline - expires).total_seconds()) < 1 for j in lines if j.deadline)
    assert all(j.deadline for j in lines) and redis.zcard(fair_edf_key(f"gpuq:{MODEL}:generate:low:admin")) == 3


def test_metrics_count_the_queued_work_and_the_jobs_past_their_deadline(client, session, redis):
    slow_history(session)  # prompts of 75 tokens lately
    client.post("/v1/jobs", json=job(max_tokens=40, n=2))
    session.add(
        Job(
            id="late",
            kind="embed",
            model=MODEL,
            priority=1,
            status="queued",
            request_hash="h",
            request={"input": ["x"]},
            deadline=utcnow() - timedelta(seconds=1),
        )
    )  # an embedding (not counted at submission) still queued after its deadline
    session.commit()

    parsed = samples(client.get("/metrics").text)

    assert value(parsed, "gpuq_queued_jobs_past_deadline", model=MODEL) == 1
    assert value(parsed, "gpuq_queued_completion_tokens", model=MODEL) == 80  # 40 tokens, twice
    counted = session.query(Job).filter(Job.status == "queued", Job.kind == "generate").one().prompt_tokens
    assert value(parsed, "gpuq_queued_prompt_tokens", model=MODEL) == counted + 75  # the embedding at the mean


HI = [{"role": "user", "content": "Hi"}]
CHAT = {"model": MODEL, "messages": HI, "max_tokens": 100}
RESPONSE = {"model": MODEL, "input": "Hi", "max_output_tokens": 100, "background": True}
MESSAGE = {"model": MODEL, "messages": HI, "max_tokens": 100}
PREDICT = {"stream": False, "options": {"num_predict": 100}}
OLLAMA_GENERATE = {"model": MODEL, "prompt": "Hi"} | PREDICT
OLLAMA_CHAT = {"model": MODEL, "messages": HI} | PREDICT

# Every drop-in route that queues a job; each answers in its family's error shape.
DROPIN_CALLS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 100}),
    ("/v1/embeddings", {"model": MODEL, "input": "Hi"}),
    ("/v1/responses", RESPONSE),
    ("/v1/messages", MESSAGE),
    ("/api/generate", OLLAMA_GENERATE),
    ("/api/chat", OLLAMA_CHAT),
    ("/api/embed", {"model": MODEL, "input": "Hi"}),
    ("/api/embeddings", {"model": MODEL, "prompt": "Hi"}),
]


def refusal(response, status: int) -> str:
    """The refusal's message, once its status and its route family's error shape are checked:
    Ollama's under /api/, Anthropic's on /v1/messages, OpenAI's (naming the header) elsewhere."""
    assert response.status_code == status, response.text
    body, path = response.json(), response.request.url.path
    if path.startswith("/api/"):
        assert set(body) == {"error"}, body
        return str(body["error"])
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    if path == "/v1/messages":
        assert set(body) == {"type", "error"} and body["type"] == "error" and body["error"]["type"] == kind, body
        return str(body["error"]["message"])
    assert body["error"]["type"] == kind and body["detail"] == body["error"]["message"], body
    assert body["error"]["param"] == "X-Gpuq-Deadline", body
    return str(body["error"]["message"])


@pytest.mark.parametrize(("path", "body"), DROPIN_CALLS, ids=[path for path, _ in DROPIN_CALLS])
@pytest.mark.parametrize(
    ("header", "message"),
    [("soon", "not an ISO 8601 time"), ("2099-01-01T00:00:00", "time zone"), ("2020-01-01T00:00:00Z", "has passed")],
)
def test_every_drop_in_route_refuses_a_deadline_header_that_is_not_a_future_time_with_a_zone(
    client, redis, job_rows, path, body, header, message
):
    response = client.post(path, json=body, headers={"X-Gpuq-Deadline": header})
    said = refusal(response, 400)
    assert said.startswith("X-Gpuq-Deadline: ") and message in said
    assert job_rows() == [] and redis_job_keys(redis) == []


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def test_a_background_responses_deadline_header_reaches_its_job(client):
    due = in_(3600)
    created = client.post("/v1/responses", json=RESPONSE, headers={"X-Gpuq-Deadline": due.isoformat()})
    assert created.status_code == 200, created.text
    shown = client.get(f"/v1/jobs/{created.headers['X-Gpuq-Job-Id']}").json()
    assert abs((_aware(datetime.fromisoformat(shown["deadline"])) - due).total_seconds()) < 1


def waiting_call(client: TestClient, job_rows, path: str, body: dict, headers: dict) -> tuple[Job, Any]:
    """A call that waits for its job's end (no worker runs here): its job once queued, and the
    call's answer after the job is cancelled, as `POST /v1/jobs/{id}/cancel` ends it."""
    answers: list[Any] = []  # TestClient's responses
    caller = threading.Thread(target=lambda: answers.append(client.post(path, json=body, headers=headers)))
    caller.start()
    rows: list[Job] = []
    for _ in range(600):  # at most 30 s for the call to queue its job
        rows = job_rows()
        if rows or not caller.is_alive():
            break
        time.sleep(0.05)
    assert len(rows) == 1, answers[0].text if answers else "the call queued no job"
    assert client.post(f"/v1/jobs/{rows[0].id}/cancel").status_code == 200
    caller.join(30)
    assert not caller.is_alive(), "the call did not end with its job"
    return rows[0], answers[0]


WAITING = [(path, body) for path, body in DROPIN_CALLS if path == "/v1/messages" or path.startswith("/api/")]


@pytest.mark.parametrize(("path", "body"), WAITING, ids=[path for path, _ in WAITING])
def test_anthropics_and_ollamas_routes_give_the_deadline_header_to_the_calls_job(client, job_rows, path, body):
    due = in_(3600)

    job, answer = waiting_call(client, job_rows, path, body, {"X-Gpuq-Deadline": due.isoformat()})

    assert job.deadline is not None and abs((_aware(job.deadline) - due).total_seconds()) < 1
    shown = client.get(f"/v1/jobs/{job.id}").json()
    assert abs((_aware(datetime.fromisoformat(shown["deadline"])) - due).total_seconds()) < 1
    assert "cancelled" in refusal(answer, 409 if path == "/v1/messages" else 500)


@both_databases
def test_a_call_the_fleet_cannot_answer_by_its_deadline_header_is_refused_in_openais_shape(
    client, session, redis, job_rows
):
    slow_history(session)
    before = len(job_rows())

    refused = client.post("/v1/chat/completions", json=CHAT, headers={"X-Gpuq-Deadline": in_(30).isoformat()})

    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "deadline_unreachable")
    assert error["param"] == "X-Gpuq-Deadline"  # what the call gave it in
    assert int(refused.headers["Retry-After"]) > 0
    assert len(job_rows()) == before and redis_job_keys(redis) == []


LATE = [("/v1/responses", RESPONSE), ("/v1/messages", MESSAGE), ("/api/generate", OLLAMA_GENERATE)]


@pytest.mark.parametrize(("path", "body"), LATE, ids=[path for path, _ in LATE])
def test_a_call_the_fleet_cannot_answer_by_its_deadline_header_is_a_429_in_its_familys_shape(
    client, session, redis, job_rows, path, body
):
    slow_history(session)  # 0.6 tokens/s: about 50 tokens to generate take about 85 s
    before = len(job_rows())

    refused = client.post(path, json=body, headers={"X-Gpuq-Deadline": in_(30).isoformat()})

    assert "cannot be done by its deadline" in refusal(refused, 429)
    assert int(refused.headers["Retry-After"]) > 0
    assert len(job_rows()) == before and redis_job_keys(redis) == []
    if path == "/v1/responses":
        assert refused.json()["error"]["code"] == "deadline_unreachable"


def test_the_openapi_document_declares_the_deadline_header_on_every_drop_in_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, _ in DROPIN_CALLS:
        headers = {p["name"] for p in paths[path]["post"].get("parameters", []) if p["in"] == "header"}
        assert {"X-Gpuq-Deadline", "X-Gpuq-Priority"} <= headers, path
