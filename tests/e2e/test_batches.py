"""OpenAI-compatible batches driven by the official `openai` client, against real processes:
the API, a worker and the scheduler (which finalises batches)."""

import json
import math
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from openai import OpenAI

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, Schedule, utcnow
from tests.e2e.conftest import as_a_foreground_job

MODEL = "smollm2-135m"
DONE = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture
def openai_client(processes):
    processes.settings |= {"GPUQ_RECONCILE_INTERVAL_S": "60"}
    _api, url = processes.start_api()
    processes.start_scheduler()
    client = OpenAI(base_url=f"{url}/v1", api_key=processes.admin_key, max_retries=0)
    yield client, url
    client.close()


def admin(processes):
    return {"Authorization": f"Bearer {processes.admin_key}"}


def line(custom_id, url, body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def chat(custom_id, text, **extra):
    return line(
        custom_id,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0} | extra,
    )


def embed(custom_id, text):
    return line(custom_id, "/v1/embeddings", {"model": MODEL, "input": text})


def upload(client, tmp_path, lines, name="batch.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch")


def wait(client, batch_id, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in DONE:
            return batch
        time.sleep(0.3)
    raise TimeoutError(f"batch {batch_id} is still {batch.status}")


def by_custom_id(client, file_id):
    return {row["custom_id"]: row for row in map(json.loads, client.files.content(file_id).text.splitlines())}


def test_a_mixed_batch_runs_to_completion_with_output_and_error_files(openai_client, processes, tmp_path, model_path):
    client, _url = openai_client
    fragile = processes.workdir / "models" / "fragile.gguf"
    fragile.symlink_to(model_path)
    with processes.client(_url) as gpuq:
        gpuq.register_model({"name": "fragile", "path": "fragile.gguf"})
    lines = [
        chat("q1", "What is 2+2?"),
        chat("q2", "Name a colour."),
        line("c1", "/v1/completions", {"model": MODEL, "prompt": "The sky is", "max_tokens": 4, "temperature": 0}),
        embed("e1", "The cat sat on the mat."),
        embed("e2", "The cat sat on the mat."),
        embed("e3", "Quarterly revenue grew."),
        line("e4", "/v1/embeddings", {"model": MODEL, "input": ["one", "two"]}),
        chat("broken", "hi").replace(MODEL, "fragile"),
    ]
    uploaded = upload(client, tmp_path, lines)
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "t1"}
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 8 and batch.metadata == {"run": "t1"}
    os.unlink(fragile)  # its model file is gone before any worker loads it: that line fails at run time
    processes.start_worker()
    done = wait(client, batch.id)
    assert done.status == "completed" and done.completed_at and done.output_file_id and done.error_file_id
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (8, 7, 1)

    out = by_custom_id(client, done.output_file_id)
    assert sorted(out) == ["c1", "e1", "e2", "e3", "e4", "q1", "q2"]
    answer = out["q1"]["response"]
    assert answer["status_code"] == 200 and answer["body"]["object"] == "chat.completion"
    assert answer["body"]["choices"][0]["message"]["content"] and answer["body"]["usage"]["completion_tokens"] > 0
    assert out["c1"]["response"]["body"]["object"] == "text_completion"
    vectors = {cid: out[cid]["response"]["body"]["data"] for cid in ("e1", "e2", "e3", "e4")}
    assert vectors["e1"][0]["embedding"] == vectors["e2"][0]["embedding"]  # identical texts, identical vectors
    assert vectors["e1"][0]["embedding"] != vectors["e3"][0]["embedding"]
    assert [len(v) for v in vectors.values()] == [1, 1, 1, 2] and [d["index"] for d in vectors["e4"]] == [0, 1]
    assert all(math.isclose(sum(x * x for x in d["embedding"]), 1.0, rel_tol=1e-6) for d in vectors["e4"])

    errors = by_custom_id(client, done.error_file_id)
    assert list(errors) == ["broken"] and errors["broken"]["response"] is None
    assert "fragile.gguf" in errors["broken"]["error"]["message"]

    # The four embedding lines ran as one llama.cpp group, not four calls.
    jobs = processes_jobs(processes, batch.id)
    assert sorted(j["line_count"] for j in jobs) == [1, 1, 1, 1, 4]
    listed = client.batches.list(limit=10)
    assert [b.id for b in listed.data] == [batch.id]


def processes_jobs(processes, batch_id):
    engine = sync_engine(processes.database_url)
    with sync_sessions(engine)() as session:
        rows = session.query(Job).filter(Job.batch_id == batch_id).all()
        jobs = [{"line_count": j.line_count, "status": j.status} for j in rows]
    engine.dispose()
    return jobs


def test_cancelling_a_batch_stops_queued_and_running_jobs(openai_client, processes, tmp_path):
    client, url = openai_client
    counting = {"max_tokens": 400, "temperature": 0}
    lines = [
        line(f"n{i}", "/v1/completions", {"model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,"} | counting)
        for i in range(5)
    ]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, lines).id, endpoint="/v1/completions", completion_window="24h"
    )
    processes.start_worker()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = httpx.get(f"{url}/v1/batches/{batch.id}/progress", headers=admin(processes)).json()
        if progress["lines_by_status"].get("running"):
            break
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait(client, batch.id, timeout_s=60)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts.failed == 5 and done.request_counts.completed == 0
    errors = by_custom_id(client, done.error_file_id)
    assert sorted(errors) == [f"n{i}" for i in range(5)]
    assert {e["error"]["code"] for e in errors.values()} == {"batch_cancelled"}


def test_two_schedulers_fire_each_tick_of_a_schedule_exactly_once(processes, tmp_path):
    processes.settings |= {"GPUQ_RECONCILE_INTERVAL_S": "60"}
    _api, url = processes.start_api()
    processes.start_scheduler()
    processes.start_scheduler()
    processes.start_worker()
    engine = sync_engine(processes.database_url)
    sessions = sync_sessions(engine)
    # Due only when the test says so: an every-minute cron also fired on its own whenever the
    # test ran across a minute's turn (a third run, 2 s after the first).
    body = {"name": "new-year", "cron": "0 0 1 1 *", "requests": [json.loads(chat("q", "Say hi."))]}
    schedule = httpx.post(f"{url}/v1/schedules", json=body, headers=admin(processes)).json()
    for tick in range(2):
        # The clock we control: make the schedule due now instead of waiting a minute.
        with sessions() as session:
            row = session.get(Schedule, schedule["id"])
            row.next_fire_at = utcnow() - timedelta(seconds=1)
            session.commit()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            runs = httpx.get(f"{url}/v1/schedules/{schedule['id']}/runs", headers=admin(processes)).json()["data"]
            if len(runs) > tick:
                break
            time.sleep(0.2)
        time.sleep(2)  # both schedulers have ticked at least once more meanwhile
    runs = httpx.get(f"{url}/v1/schedules/{schedule['id']}/runs", headers=admin(processes)).json()["data"]
    assert len(runs) == 2 and len({r["fire_time"] for r in runs}) == 2
    assert all(r["trigger"] == "cron" and r["batch_id"] for r in runs)
    for run in runs:
        deadline = time.monotonic() + 60
        while (
            httpx.get(f"{url}/v1/batches/{run['batch_id']}", headers=admin(processes)).json()["status"] != "completed"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
    engine.dispose()


def test_the_cli_submits_follows_and_fetches_a_batch(openai_client, processes, tmp_path):
    _client, url = openai_client
    processes.start_worker()
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([chat("x", "Say yes."), embed("y", "hello")]) + "\n")
    cli = [sys.executable, "-m", "gpuq.cli"]
    env = {**os.environ, "GPUQ_API_KEY": processes.admin_key}
    submitted = subprocess.run(
        [*cli, "batch", "submit", "--url", url, str(path), "--wait"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    batch_id = submitted.stdout.strip()
    assert batch_id.startswith("batch_") and f"{batch_id} completed: 2 completed, 0 failed of 2" in submitted.stderr
    results = subprocess.run(
        [*cli, "batch", "results", "--url", url, batch_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    assert sorted(json.loads(r)["custom_id"] for r in results.splitlines()) == ["x", "y"]

    def gpuq(*args):
        return subprocess.run(
            [*cli, *args, "--url", url], capture_output=True, text=True, timeout=60, check=True, env=env
        )

    added = gpuq("schedules", "add", "nightly", "0 2 * * *", str(path), "--timezone", "Europe/Paris").stdout
    schedule_id = added.split()[1]
    # In the schedule's own zone, as its cron is read: 02:00 in Paris (CET or CEST).
    assert re.search(r"\(nightly\): next run \d{4}-\d\d-\d\d 02:00 CES?T", added), added
    assert "nightly" in gpuq("schedules", "list").stdout
    gpuq("schedules", "run", schedule_id)
    assert "manual" in gpuq("schedules", "runs", schedule_id).stdout
    gpuq("schedules", "pause", schedule_id)
    assert "paused" in gpuq("schedules", "list").stdout


def test_run_batch_runs_a_file_without_a_server(tmp_path):
    path, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    path.write_text("\n".join([chat("x", "Say yes."), embed("y", "hello"), embed("z", "hello")]) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")} | {"GPUQ_WORKER_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gpuq.cli", "run-batch", "-i", str(path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {json.loads(r)["custom_id"]: json.loads(r) for r in out.read_text().splitlines()}
    assert sorted(rows) == ["x", "y", "z"]
    assert rows["y"]["response"]["body"]["data"] == rows["z"]["response"]["body"]["data"]
    assert "completed: 3 completed, 0 failed of 3" in done.stderr


def test_run_batch_ctrl_c_says_how_far_it_got_and_that_nothing_was_written(tmp_path):
    """In a terminal (a pty): the bar's time estimate is labelled ETA, no worker line crosses
    it, and Ctrl-C ends the command with how far the batch got and what was written."""
    import pty
    import signal
    import threading

    path, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    # Each answer runs to its max_tokens (a count), so the lines end in waves of the worker's slots:
    # after the first lines answered (the bar's ETA) most of the batch is still to run.
    lines = [
        chat(f"c{i}", f"Write the numbers from 1 to {100 + i}, separated by commas.", max_tokens=32) for i in range(40)
    ]
    path.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")} | {"GPUQ_WORKER_THREADS": "1"}
    primary, replica = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli", "run-batch", "-i", str(path), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=replica,
        env=env,
        cwd=tmp_path,
        preexec_fn=as_a_foreground_job,
    )
    os.close(replica)
    shown: list[bytes] = []
    progress = threading.Event()

    def read() -> None:
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:
                return
            if not chunk:
                return
            shown.append(chunk)
            if b"ETA " in b"".join(shown):
                progress.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert progress.wait(timeout=240), b"".join(shown).decode(errors="replace")[-2000:]
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    reader.join(timeout=10)
    text = b"".join(shown).decode(errors="replace")
    stopped = r"interrupted: batch_\w+ \w+: \d+ completed, 0 failed of 40 so far; nothing written to"
    assert re.search(stopped, text), text
    assert not out.exists()
    assert " INFO " not in text and "llama_" not in text, text
