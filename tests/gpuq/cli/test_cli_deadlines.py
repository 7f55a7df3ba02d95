"""`--deadline` on `gpuq submit` and `gpuq run`, deadlines in `gpuq job` and `gpuq jobs`, and
`--completion-window` on `gpuq batch submit` and `gpuq schedules add` (its lines' deadline, or
its runs' batches'), against the real API (no worker: the jobs stay queued). A deadline or
window given wrong is one line and nothing sent; one the fleet cannot make is the API's 429 in
one line with its Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gpuq.cli.deadline import parse_deadline, shown
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Batch, File, Job
from tests.api.test_deadlines_api import slow_history
from tests.gpuq.cli.conftest import MODEL, Api, assert_one_line_error, run

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def env(api: Api) -> dict[str, str | None]:
    return {"GPUQ_API_URL": api.url, "GPUQ_API_KEY": api.key, "GPUQ_DATA_DIR": str(api.data_dir)}


def _job_count(api: Api) -> int:
    with sync_sessions(sync_engine(api.database_url))() as session:
        return session.query(Job).count()


@pytest.mark.parametrize(
    ("given", "after"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("1h30m", timedelta(minutes=90)),
        ("1D", timedelta(days=1)),
        ("2026-12-07T18:00:00Z", timedelta(hours=6)),
        ("2026-12-07T14:00:00+01:00", timedelta(hours=1)),
    ],
)
def test_a_deadline_is_a_duration_from_now_or_a_time_with_a_zone(given: str, after: timedelta) -> None:
    assert parse_deadline(given, now=NOW) == NOW + after
    with pytest.raises(ValueError, match="has passed"):  # 13:00 at +01:00 is 12:00 UTC: now, not ahead
        parse_deadline("2026-12-07T13:00:00+01:00", now=NOW)


def test_a_queued_jobs_passed_deadline_is_said_to_be_passed() -> None:
    assert shown("2026-12-07T11:00:00Z", "queued", now=NOW) == "2026-12-07 11:00:00Z (passed, still queued)"
    assert shown("2026-12-07T11:00:00Z", "succeeded", now=NOW) == "2026-12-07 11:00:00Z"
    assert shown("2026-12-07T13:00:00", "queued", now=NOW) == "2026-12-07 13:00:00Z"  # SQLite's: UTC
    assert shown(None, "queued", now=NOW) == ""


def test_submit_sends_the_deadline_and_job_and_jobs_show_it(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    before = datetime.now(UTC)
    plain = run(["submit", MODEL, "no", "deadline", "--no-wait"], env, tmp_path)
    dated = run(["submit", MODEL, "hi", "--deadline", "2h", "--no-wait"], env, tmp_path)
    assert plain.exit_code == 0 and dated.exit_code == 0, plain.output + dated.output
    job_id = dated.stdout.strip()

    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}) as http:
        deadline = datetime.fromisoformat(http.get(f"/v1/jobs/{job_id}").json()["deadline"]).replace(tzinfo=UTC)
    assert before + timedelta(hours=2) <= deadline <= datetime.now(UTC) + timedelta(hours=2)

    shown_job = run(["job", job_id], env, tmp_path)
    assert shown_job.exit_code == 0, shown_job.output
    [line] = [line for line in shown_job.stdout.splitlines() if line.strip().startswith("deadline")]
    assert line.split(None, 1)[1] == deadline.strftime("%Y-%m-%d %H:%M:%SZ")
    plain_job = run(["job", plain.stdout.strip()], env, tmp_path)
    assert "deadline" not in plain_job.stdout

    listed = run(["jobs", "--status", "queued"], env, tmp_path).stdout.splitlines()
    assert listed[0].split()[-1] == "DEADLINE"
    [row] = [r for r in listed if r.startswith(job_id)]
    assert row.endswith(deadline.strftime("%Y-%m-%d %H:%M:%SZ"))


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("soon", "is neither a duration nor an ISO 8601 time"),
        ("2026-12-07T18:00:00", "has no time zone"),
        ("2020-01-01T00:00:00Z", "has passed"),
        ("0m", "give a duration above zero"),
        ("-5m", "is neither a duration"),
    ],
)
@pytest.mark.parametrize("command", [["submit", "--no-wait"], ["run", "--max-tokens", "4"]])
def test_a_deadline_given_wrong_is_one_line_and_nothing_is_submitted(
    api: Api, env: dict[str, str | None], tmp_path: Path, given: str, says: str, command: list[str]
) -> None:
    before = _job_count(api)
    result = run([*command, MODEL, "hi", "--deadline", given], env, tmp_path)
    assert_one_line_error(result, says, exit_code=2)
    assert "--deadline" in result.stderr
    assert _job_count(api) == before


def test_the_run_routes_deadline_header_reaches_the_job(api: Api) -> None:
    # What `gpuq run --deadline` sends; the stream is left before any worker answers, which
    # cancels the job.
    due = datetime.now(UTC) + timedelta(hours=1)
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}) as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Gpuq-Deadline": due.isoformat()}) as r:
            assert r.status_code == 200
            job_id = r.headers["x-gpuq-job-id"]
            deadline = datetime.fromisoformat(http.get(f"/v1/jobs/{job_id}").json()["deadline"])
        assert abs((deadline.replace(tzinfo=UTC) - due).total_seconds()) < 1
        refused = http.post("/v1/chat/completions", json=body, headers={"X-Gpuq-Deadline": "tomorrow"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Gpuq-Deadline"


def _batches_and_files(api: Api) -> tuple[int, int]:
    with sync_sessions(sync_engine(api.database_url))() as session:
        return session.query(Batch).count(), session.query(File).count()


def test_batch_submit_sends_its_completion_window_and_the_batch_expires_at_its_end(
    api: Api, env: dict[str, str | None], tmp_path: Path, batch_file: Path
) -> None:
    given = run(["batch", "submit", str(batch_file), "--completion-window", "2h"], env, tmp_path)
    plain = run(["batch", "submit", str(batch_file)], env, tmp_path)
    assert given.exit_code == 0 and plain.exit_code == 0, given.output + plain.output

    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}) as http:
        two_hours = http.get(f"/v1/batches/{given.stdout.strip()}").json()
        a_day = http.get(f"/v1/batches/{plain.stdout.strip()}").json()
    assert two_hours["completion_window"] == "2h" and a_day["completion_window"] == "24h"
    assert abs(two_hours["expires_at"] - two_hours["created_at"] - 2 * 3600) <= 1  # whole seconds, each rounded
    assert abs(a_day["expires_at"] - a_day["created_at"] - 24 * 3600) <= 1


@pytest.mark.parametrize("given", ["2d", "0h", "169h", "24", "soon"])
def test_a_completion_window_the_api_would_refuse_is_one_line_and_nothing_is_sent(
    api: Api, env: dict[str, str | None], tmp_path: Path, batch_file: Path, given: str
) -> None:
    before = _batches_and_files(api)
    result = run(["batch", "submit", str(batch_file), "--completion-window", given], env, tmp_path)
    assert_one_line_error(result, f"{given!r} is not supported; use hours from 1h to 168h, e.g. 24h", exit_code=2)
    assert "--completion-window" in result.stderr
    assert _batches_and_files(api) == before  # not even the file was uploaded


def _schedules(api: Api) -> list[dict]:
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}) as http:
        data: list[dict] = http.get("/v1/schedules").json()["data"]
        return data


def test_schedules_add_gives_the_schedule_its_completion_window_and_list_shows_it(
    api: Api, env: dict[str, str | None], tmp_path: Path, batch_file: Path
) -> None:
    add = ["schedules", "add"]
    six = run([*add, "six-hours", "0 2 * * *", str(batch_file), "--completion-window", "6h"], env, tmp_path)
    plain = run([*add, "a-day", "0 3 * * *", str(batch_file)], env, tmp_path)
    assert six.exit_code == 0 and plain.exit_code == 0, six.output + plain.output
    windows = {s["name"]: s["completion_window"] for s in _schedules(api)}
    assert (windows["six-hours"], windows["a-day"]) == ("6h", "24h")

    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {api.key}"}) as http:
        [made] = [s for s in _schedules(api) if s["name"] == "six-hours"]
        run_ = http.post(f"/v1/schedules/{made['id']}/run").json()
        batch = http.get(f"/v1/batches/{run_['batch_id']}").json()
    assert batch["completion_window"] == "6h" and abs(batch["expires_at"] - batch["created_at"] - 6 * 3600) <= 1

    listed = run(["schedules", "list"], env, tmp_path).stdout.splitlines()
    assert listed[0].split()[6] == "WINDOW"  # after MISFIRE
    column = listed[0].index("WINDOW")  # the cron's spaces make splitting rows ambiguous
    shown = {row.split()[1]: row[column:].split()[0] for row in listed[1:]}
    assert (shown["six-hours"], shown["a-day"]) == ("6h", "24h")


@pytest.mark.parametrize("given", ["2d", "0h", "169h", "soon"])
def test_a_schedules_completion_window_the_api_would_refuse_is_one_line_and_nothing_is_sent(
    api: Api, env: dict[str, str | None], tmp_path: Path, batch_file: Path, given: str
) -> None:
    before = _batches_and_files(api), len(_schedules(api))
    add = ["schedules", "add", "never", "0 2 * * *", str(batch_file)]
    result = run([*add, "--completion-window", given], env, tmp_path)
    assert_one_line_error(result, f"{given!r} is not supported; use hours from 1h to 168h, e.g. 24h", exit_code=2)
    assert "--completion-window" in result.stderr
    assert (_batches_and_files(api), len(_schedules(api))) == before  # not even the file was uploaded


def test_a_deadline_the_fleet_cannot_make_is_the_apis_429_in_one_line_with_its_retry_after(
    api: Api, env: dict[str, str | None], tmp_path: Path
) -> None:
    # A slow model lately (0.6 tokens/s): 30 s is far too soon for any answer. Last in this
    # module, as this history is the model's pace from now on.
    with sync_sessions(sync_engine(api.database_url))() as session:
        slow_history(session)
    before = _job_count(api)
    for command in (["submit", MODEL, "hi", "--max-tokens", "100"], ["run", MODEL, "hi", "--max-tokens", "100"]):
        result = run([*command, "--deadline", "30s"], env, tmp_path)
        assert_one_line_error(result, "cannot be done by its deadline", exit_code=1)
        retry_after = result.stderr.split("Retry-After: ")[1].split(" s")[0]
        assert int(retry_after) > 0 and "HTTP 429" in result.stderr, result.stderr
    assert _job_count(api) == before
