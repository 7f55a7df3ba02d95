"""/v1/stats over HTTP: admins only, every bad input a 422 that says what to fix."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import utcnow
from tests.api.conftest import bearer
from tests.conftest import both_databases
from tests.gpuq.stats.test_stats import MODEL, job

ENDPOINTS = ["summary", "throughput", "failures", "energy", "gpus", "queues"]


@pytest.fixture
def history(database_url: str) -> None:
    """Two finished jobs a few minutes ago (one failed), for tenant acme."""
    engine = sync_engine(database_url)
    now = utcnow()
    with sync_sessions(engine)() as s:
        s.add_all(
            [
                job(1, now - timedelta(minutes=5), energy_j=40.0),
                job(2, now - timedelta(minutes=4), status="failed", error="CUDA error: out of memory"),
            ]
        )
        s.commit()
    engine.dispose()


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_admin_reads_every_stats_endpoint(client: TestClient, history: None, endpoint: str) -> None:
    response = client.get(f"/v1/stats/{endpoint}")
    assert response.status_code == 200, response.text


def test_summary_reports_the_last_hour_by_default(client: TestClient, history: None) -> None:
    body = client.get("/v1/stats/summary", params={"model": MODEL, "tenant": "acme"}).json()
    assert body["finished"] == {"succeeded": 1, "failed": 1, "cancelled": 0}
    assert body["usage"]["energy_j"] == 40.0 and body["usage"]["energy_jobs"] == 1
    assert body["run_time"]["exact"] is True and body["run_time"]["p50_ms"] == 2000.0
    failures = client.get("/v1/stats/failures", params={"top": 1}).json()
    assert failures["failed"] == 1 and failures["data"][0]["reason"] == "CUDA error: out of memory"


def test_submitters_are_refused_and_anonymous_callers_asked_for_a_key(client: TestClient, make_key) -> None:
    submitter = make_key("submitter", "acme")
    assert client.get("/v1/stats/summary", headers=bearer(submitter)).status_code == 403
    assert client.get("/v1/stats/summary", headers={"Authorization": ""}).status_code == 401


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "reversed"),
        ({"since": "2025-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "at most 90 days"),
        ({"since": "2026-01-01T00:00:00"}, "has no time zone"),
        ({"since": "yesterday"}, "since"),
        ({"model": "gpt-5"}, "unknown model 'gpt-5'; known: smollm2-135m"),
        ({"tenant": "nobody"}, "unknown tenant 'nobody'"),
        ({"gpu": "GPU-nope"}, "unknown gpu 'GPU-nope'"),
        ({"host": "nowhere"}, "unknown host 'nowhere'"),
        ({"kind": "train"}, "unknown kind 'train'; use one of: generate, embed, noop"),
        ({"priority": "urgent"}, "unknown priority 'urgent'; use one of: high, normal, low"),
    ],
)
def test_bad_windows_and_filters_are_422_saying_what_to_fix(client: TestClient, params: dict, message: str) -> None:
    response = client.get("/v1/stats/summary", params=params)
    assert response.status_code == 422
    assert message in response.text


def test_bad_buckets_and_top_are_422(client: TestClient) -> None:
    unknown = client.get("/v1/stats/throughput", params={"bucket": "2m"})
    assert unknown.status_code == 422 and "use one of: 1m, 5m, 1h, 1d" in unknown.text
    week = {"since": "2026-01-01T00:00:00Z", "until": "2026-01-20T00:00:00Z", "bucket": "1h"}
    too_fine = client.get("/v1/stats/throughput", params=week)
    assert too_fine.status_code == 422 and "use bucket=1d" in too_fine.text
    assert client.get("/v1/stats/failures", params={"top": 0}).status_code == 422


def test_position_is_for_the_owner_or_admins_and_null_when_not_queued(
    client: TestClient, history: None, make_key
) -> None:
    job_id = client.post("/v1/jobs", json={"kind": "noop", "model": MODEL}).json()["id"]
    queued = client.get(f"/v1/jobs/{job_id}/position").json()
    assert queued["position"] == 0 and queued["queue"] == f"gpuq:{MODEL}:noop:normal:admin"
    finished = client.get(f"/v1/jobs/{job(1, None).id}/position").json()  # job 1 of `history`
    assert finished["position"] is None and finished["status"] == "succeeded"
    other = make_key("submitter", "globex")
    assert client.get(f"/v1/jobs/{job_id}/position", headers=bearer(other)).status_code == 404


@both_databases
def test_fleet_throughput_is_per_wall_clock_second_apart_from_each_sequences_decode_speed(
    client: TestClient, database_url: str
) -> None:
    # Eight sequences decoded together for the same 10 s, 100 tokens each: each ran at 10 tok/s,
    # and the fleet made 800 tokens in a 10-minute window.
    engine = sync_engine(database_url)
    end = utcnow() - timedelta(minutes=2)
    with sync_sessions(engine)() as s:
        s.add_all([job(n, end, run_ms=10_000, tokens=100) for n in range(8)])
        s.commit()
    engine.dispose()
    window = {"since": (end - timedelta(minutes=8)).isoformat(), "until": (end + timedelta(minutes=2)).isoformat()}
    usage = client.get("/v1/stats/summary", params=window).json()["usage"]
    assert (usage["completion_tokens"], usage["prompt_tokens"]) == (800, 40)
    assert usage["tokens_per_s"] == 10.0  # per sequence: 100 tokens over its 10 s
    assert usage["fleet_tokens_per_s"] == pytest.approx(800 / 600, abs=0.001)  # per second of the window
    # A window reaching past now counts only the seconds that have passed.
    ahead = {"since": window["since"], "until": (utcnow() + timedelta(minutes=50)).isoformat()}
    assert client.get("/v1/stats/summary", params=ahead).json()["usage"]["fleet_tokens_per_s"] == pytest.approx(
        800 / 600, rel=0.01
    )
    energy = client.get("/v1/stats/energy", params=window).json()
    assert energy["by_model"][0]["fleet_tokens_per_s"] == pytest.approx(800 / 600, abs=0.001)
