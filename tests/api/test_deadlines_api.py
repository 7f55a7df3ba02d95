"""Deadlines over HTTP: a job says when it is needed by, is shown with it and goes first among
its tenant's jobs of its priority; a job or batch the fleet cannot finish in time is refused
(429, Retry-After, OpenAI's error shape) and nothing is stored or queued for it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

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


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 100}),
        ("/v1/embeddings", {"model": MODEL, "input": "Hi"}),
    ],
)
@pytest.mark.parametrize(
    ("header", "message"),
    [("soon", "not an ISO 8601 time"), ("2099-01-01T00:00:00", "time zone"), ("2020-01-01T00:00:00Z", "has passed")],
)
def test_openais_routes_refuse_a_deadline_header_that_is_not_a_future_time_with_a_zone(
    client, redis, job_rows, path, body, header, message
):
    response = client.post(path, json=body, headers={"X-Gpuq-Deadline": header})
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    assert response.json()["error"]["param"] == "X-Gpuq-Deadline"
    assert job_rows() == [] and redis_job_keys(redis) == []


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
    assert int(refused.headers["Retry-After"]) > 0
    assert len(job_rows()) == before and redis_job_keys(redis) == []
