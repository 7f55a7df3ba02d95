"""Schemathesis against the live API's own OpenAPI document: no request it can generate from
the document gets a 5xx, or a status, content type, header or body the document does not
declare. With an admin key and with a submitter key, each pass a test of its own, on
PostgreSQL (where NUL characters and integers past INTEGER used to be 500s).

Bounded and repeatable: a fixed seed, deterministic generation (no example database), a
fixed number of cases per operation (plus Schemathesis's coverage cases: boundaries,
wrong types, missing fields). The routes that run a model (OpenAI's, Anthropic's and Ollama's) answer
once a worker has run the call's job, and this run starts no worker, so a valid random
request to them would wait for one: they get the coverage cases (their refusals), not the
random ones, and are run with real clients and a worker in tests/e2e/test_openai_client.py,
test_anthropic_client.py and test_ollama_client.py. The API is a real uvicorn server on loopback, started in this
process so that webhook host names go through a stub resolver: fuzzed webhook URLs must not
make the API send DNS queries off the machine (the socket guard would fail the test).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.main import create_app
from gpuq.local.redis_server import free_port
from gpuq.settings import Settings
from tests.network_guard import PUBLIC_ADDRESS, StubResolver, guarded_network

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
]
EXAMPLES_PER_OPERATION = int(os.environ.get("GPUQ_TEST_FUZZ_EXAMPLES", "20"))
RUN_TIMEOUT_S = 600
MODEL = "smollm2-135m"
RUNS_A_MODEL = (
    r"^/(v1/(chat/completions|completions|embeddings|messages|responses)|api/(generate|chat|embed|embeddings))$"
)
PASSES = (("examples,coverage", ()), ("fuzzing", ("--exclude-path-regex", RUNS_A_MODEL)))


@pytest.fixture
def live_api(database_url: str, redis_url: str, tmp_path: Path, monkeypatch) -> Iterator[str]:
    (tmp_path / "models").mkdir()
    settings = Settings(
        database_url=database_url, redis_url=redis_url, data_dir=tmp_path, models_dir=tmp_path / "models"
    )
    app = create_app(settings, resolve=StubResolver({"hooks.example": [PUBLIC_ADDRESS]}))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    with guarded_network(monkeypatch) as network:
        thread = threading.Thread(target=server.run, name="api", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=30)
    assert network.lookups == []  # no fuzzed host name reached DNS


def seed(url: str, admin_key: str) -> None:
    """Objects for the fuzzer to find: schedule 1 and affinity rule 1 (integer ids that
    generated cases hit), and a job, a file and a batch to list."""
    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30) as http:
        for response in (
            http.post("/v1/affinity-rules", json={"model_pattern": "*", "effect": "allow"}),
            http.post("/v1/schedules", json={"name": "seed", "cron": "0 2 * * *", "requests": [line]}),
            http.post("/v1/jobs", json={"kind": "noop", "model": MODEL}),
        ):
            assert response.is_success, response.text
        upload = {"file": ("in.jsonl", json.dumps(line).encode())}
        file = http.post("/v1/files", files=upload, data={"purpose": "batch"}).json()
        batch = http.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/embeddings"})
        assert batch.is_success, batch.text


def schemathesis(
    url: str, key: str, workdir: Path, phases: str, selection: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        phases,
        *selection,
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--seed",
        "1",
        "--generation-deterministic",  # derandomized, and no example database carried between runs
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--continue-on-failure",
        "--no-color",
    ]
    return subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


# One test per key and pass, so that the four runs (minutes each) spread over the test processes.
@pytest.mark.parametrize(("phases", "selection"), PASSES, ids=[phases for phases, _ in PASSES])
@pytest.mark.parametrize("role", ["admin", "submitter"])
@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)
def test_no_generated_request_gets_a_server_error_or_an_undeclared_answer(
    live_api, make_key, tmp_path, role, phases, selection
):
    admin_key = make_key("admin", "ops")
    seed(live_api, admin_key)
    key = admin_key if role == "admin" else make_key("submitter", "acme")
    run = schemathesis(live_api, key, tmp_path, phases, selection)
    summary = run.stdout[run.stdout.rfind("SUMMARY") :]
    failures = f"Schemathesis ({phases}) with a {role} key found failures:\n{run.stdout[-20000:]}{run.stderr}"
    assert run.returncode == 0, failures
    selected = re.search(r"Selected: (\d+)/", summary)
    tested = re.search(r"Tested: (\d+)", summary)
    assert selected and tested and tested.group(1) == selected.group(1), summary  # every operation was run
    print(f"{role}, {phases}: {summary.strip().splitlines()[-1]}")
