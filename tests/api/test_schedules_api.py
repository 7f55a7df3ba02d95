"""Cron schedules over HTTP: checked at creation, paused, resumed, run by hand, previewed; each
run's batch has the schedule's completion window."""

import json
from datetime import UTC, datetime

import pytest

from gpuq.db.tables import File, Schedule
from tests.conftest import both_databases

LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
}
NIGHTLY = {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Paris", "requests": [LINE]}


def rows(session, model):
    session.expire_all()
    return session.query(model).all()


@both_databases
def test_a_schedule_is_created_previewed_paused_resumed_run_and_deleted(client, session):
    created = client.post("/v1/schedules", json=NIGHTLY)
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert schedule["next_fire_at"].endswith("T01:00:00Z") and schedule["priority"] == "low"  # 02:00 in Paris
    preview = client.get(f"/v1/schedules/{schedule['id']}/preview", params={"n": 3}).json()
    assert len(preview["next"]) == 3 and all(t.endswith("T01:00:00Z") for t in preview["next"])

    assert client.post(f"/v1/schedules/{schedule['id']}/pause").json()["enabled"] is False
    assert client.post(f"/v1/schedules/{schedule['id']}/resume").json()["enabled"] is True
    changed = client.patch(f"/v1/schedules/{schedule['id']}", json={"cron": "*/15 * * * *", "misfire": "run_once"})
    assert changed.json()["cron"] == "*/15 * * * *" and changed.json()["misfire"] == "run_once"

    run = client.post(f"/v1/schedules/{schedule['id']}/run").json()
    assert run["trigger"] == "manual" and run["batch_id"] and run["error"] is None
    history = client.get(f"/v1/schedules/{schedule['id']}/runs").json()["data"]
    assert [(h["batch_id"], h["batch_status"]) for h in history] == [(run["batch_id"], "in_progress")]
    batch = client.get(f"/v1/batches/{run['batch_id']}").json()
    assert batch["metadata"]["schedule"] == "nightly" and batch["request_counts"]["total"] == 1

    assert client.delete(f"/v1/schedules/{schedule['id']}").status_code == 204
    assert client.get(f"/v1/schedules/{schedule['id']}").status_code == 404


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"cron": "61 * * * *"}, 422, "invalid cron expression '61 * * * *'"),
        ({"timezone": "Mars/Olympus"}, 422, "unknown time zone 'Mars/Olympus'"),
        ({"requests": None}, 422, "give exactly one of `input_file_id`"),
        ({"input_file_id": "file-x"}, 422, "give exactly one of"),
        ({"requests": None, "input_file_id": "file-x"}, 422, "input file 'file-x' does not exist"),
        (
            {"requests": [LINE | {"body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}}]},
            422,
            "line 1: model 'nope' is not registered",
        ),
        ({"requests": [{"custom_id": "a"}]}, 422, "invalid requests: request 1: `method` must be POST"),
        ({"misfire": "sometimes"}, 422, "misfire: Input should be 'skip' or 'run_once'"),
        ({"cron": "0 0 31 2 *"}, 422, "never fires: no date matches it"),
        ({"cron": "* * * * * *"}, 422, "give five fields"),
        ({"endpoint": "/v1/images/generations"}, 422, "endpoint: Input should be '/v1/chat/completions'"),
        ({"priority": "urgent"}, 422, "unknown priority 'urgent'"),
        ({"completion_window": "2d"}, 422, "completion_window '2d' is not supported; use hours from 1h to 168h"),
        ({"completion_window": "169h"}, 422, "completion_window '169h' is not supported"),
    ],
)
def test_a_schedule_that_could_never_run_is_refused_and_nothing_is_kept(
    client, session, settings, change, status, message
):
    response = client.post("/v1/schedules", json=NIGHTLY | change)
    assert response.status_code == status and message in response.json()["detail"], response.text
    assert rows(session, Schedule) == [] and rows(session, File) == []
    files_dir = settings.data_dir / "files"
    assert not files_dir.exists() or list(files_dir.glob("*")) == []


def test_schedule_names_are_unique(client):
    assert client.post("/v1/schedules", json=NIGHTLY).status_code == 201
    again = client.post("/v1/schedules", json=NIGHTLY)
    assert again.status_code == 409 and "exists already" in again.json()["detail"]


def test_a_schedule_cannot_run_another_batchs_output_file(client, session):
    """An output file is not a batch input: the runs would fail every night."""
    output = File(
        id="file-output",
        purpose="batch_output",
        filename="out.jsonl",
        bytes=1,
        line_count=1,
        path="/nonexistent",
        created_at=datetime.now(UTC),
    )
    session.add(output)
    session.commit()
    response = client.post("/v1/schedules", json=NIGHTLY | {"requests": None, "input_file_id": "file-output"})
    assert response.status_code == 422 and "has purpose 'batch_output'" in response.json()["detail"], response.text
    assert rows(session, Schedule) == []


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "* * * * * *"])
def test_a_schedule_cannot_be_changed_to_a_cron_that_never_or_too_often_fires(client, cron):
    schedule = client.post("/v1/schedules", json=NIGHTLY).json()
    response = client.patch(f"/v1/schedules/{schedule['id']}", json={"cron": cron})
    assert response.status_code == 422, response.text
    assert client.get(f"/v1/schedules/{schedule['id']}").json()["cron"] == "0 2 * * *"


@both_databases
def test_a_batch_a_schedule_started_names_the_schedule_and_the_run_in_its_progress(client):
    schedule = client.post("/v1/schedules", json=NIGHTLY).json()
    run = client.post(f"/v1/schedules/{schedule['id']}/run").json()
    progress = client.get(f"/v1/batches/{run['batch_id']}/progress").json()
    assert (progress["schedule_id"], progress["schedule_name"]) == (schedule["id"], "nightly")
    assert progress["scheduled_for"] == run["fire_time"]
    upload = client.post(
        "/v1/files", files={"file": ("in.jsonl", json.dumps(LINE).encode())}, data={"purpose": "batch"}
    )
    direct = client.post(
        "/v1/batches",
        json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()
    progress = client.get(f"/v1/batches/{direct['id']}/progress").json()
    assert (progress["schedule_id"], progress["schedule_name"], progress["scheduled_for"]) == (None, None, None)


@both_databases
def test_a_schedule_s_completion_window_is_its_runs_batches_and_can_be_changed(client):
    six_hours = client.post("/v1/schedules", json=NIGHTLY | {"completion_window": "6h"})
    assert six_hours.status_code == 201, six_hours.text
    schedule = six_hours.json()
    assert schedule["completion_window"] == "6h"
    assert client.get(f"/v1/schedules/{schedule['id']}").json()["completion_window"] == "6h"
    assert [s["completion_window"] for s in client.get("/v1/schedules").json()["data"]] == ["6h"]

    run = client.post(f"/v1/schedules/{schedule['id']}/run").json()
    batch = client.get(f"/v1/batches/{run['batch_id']}").json()
    assert batch["completion_window"] == "6h"
    assert abs(batch["expires_at"] - batch["created_at"] - 6 * 3600) <= 1  # whole seconds, each rounded
    assert abs(batch["expires_at"] - datetime.fromisoformat(run["fire_time"]).timestamp() - 6 * 3600) <= 1

    changed = client.patch(f"/v1/schedules/{schedule['id']}", json={"completion_window": "48h"})
    assert changed.status_code == 200 and changed.json()["completion_window"] == "48h", changed.text
    assert changed.json()["cron"] == "0 2 * * *"  # nothing else changed
    again = client.post(f"/v1/schedules/{schedule['id']}/run").json()
    assert client.get(f"/v1/batches/{again['batch_id']}").json()["completion_window"] == "48h"


def test_a_schedule_given_no_window_runs_its_batches_in_24_hours(client):
    schedule = client.post("/v1/schedules", json=NIGHTLY).json()
    assert schedule["completion_window"] == "24h"
    run = client.post(f"/v1/schedules/{schedule['id']}/run").json()
    assert client.get(f"/v1/batches/{run['batch_id']}").json()["completion_window"] == "24h"


@pytest.mark.parametrize("window", ["2d", "0h", "169h", "24", "6H", ""])
def test_a_window_a_batch_would_not_take_is_refused_naming_the_field_and_nothing_changes(
    client, session, settings, window
):
    refused = client.post("/v1/schedules", json=NIGHTLY | {"completion_window": window})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == "completion_window"
    says = f"completion_window {window!r} is not supported; use hours from 1h to 168h, e.g. 24h"
    assert refused.json()["detail"] == says
    assert rows(session, Schedule) == [] and rows(session, File) == []
    files_dir = settings.data_dir / "files"
    assert not files_dir.exists() or list(files_dir.glob("*")) == []

    schedule = client.post("/v1/schedules", json=NIGHTLY | {"completion_window": "6h"}).json()
    patched = client.patch(f"/v1/schedules/{schedule['id']}", json={"completion_window": window, "priority": "high"})
    assert patched.status_code == 422 and patched.json()["error"]["param"] == "completion_window", patched.text
    kept = client.get(f"/v1/schedules/{schedule['id']}").json()
    assert (kept["completion_window"], kept["priority"]) == ("6h", "low")


def test_the_openapi_document_declares_the_schedules_completion_window(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ScheduleCreate", "SchedulePatch", "SchedulePublic"):
        assert "completion_window" in schemas[name]["properties"], name
    assert schemas["ScheduleCreate"]["properties"]["completion_window"]["default"] == "24h"
    assert "completion_window" in schemas["SchedulePublic"]["required"]
