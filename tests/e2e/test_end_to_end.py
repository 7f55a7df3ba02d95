"""The whole path on real processes: HTTP -> SQL -> Redis/RQ -> worker -> llama.cpp -> SQL."""

import math
import os
import subprocess
import sys
import time

import pytest

from gpuq.cli.client import ApiError
from tests.worker.generation import engine_like_llama

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# At temperature 0 SmolLM2 keeps counting until max_tokens: a job that runs for about 25 s.
COUNTING = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "max_tokens": 1500}
COUNTING |= {"temperature": 0}


def _direct_chat(model_path, messages, max_tokens):
    llm = engine_like_llama(model_path, n_ctx=2048, logits_all=False)
    try:
        return llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0, seed=42)
    finally:
        llm.close()


def test_a_chat_job_gives_llama_cpps_own_answer_and_leaves_a_full_history_row(system, model_path):
    body = {"kind": "generate", "model": MODEL, "messages": QUESTION, "max_tokens": 24, "temperature": 0, "seed": 42}
    submitted = system.client.submit(body)
    job = system.client.wait(submitted["id"], timeout_s=120)
    assert job["status"] == "succeeded", job["error"]

    expected = _direct_chat(model_path, QUESTION, 24)
    assert job["result"]["text"] == expected["choices"][0]["message"]["content"]
    assert job["result"]["finish_reason"] == expected["choices"][0]["finish_reason"]
    assert job["prompt_tokens"] == submitted["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert job["completion_tokens"] == expected["usage"]["completion_tokens"]

    assert job["worker"] == system.worker_name and job["device"] == "cpu" and job["attempts"] == 1
    assert job["created_at"] <= job["started_at"] <= job["finished_at"]
    assert job["queue_wait_ms"] >= 0 and job["run_ms"] > 0 and job["load_ms"] is not None

    # The worker does not fork per job: the model is still loaded for the next one.
    again = system.client.wait(system.client.submit(body)["id"], timeout_s=60)
    assert again["result"]["text"] == job["result"]["text"]
    assert again["load_ms"] == 0 and again["worker"] == system.worker_name


def test_keep_alive_zero_unloads_the_model_right_after_the_job(system):
    body = {"kind": "generate", "model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    system.client.wait(system.client.submit(body)["id"])
    kept = system.client.wait(system.client.submit(body)["id"])
    assert kept["load_ms"] == 0  # the default keep_alive (5 minutes) kept it loaded
    system.client.wait(system.client.submit(body | {"keep_alive": 0})["id"])
    reloaded = system.client.wait(system.client.submit(body)["id"])
    assert reloaded["load_ms"] > 0


def test_an_embedding_job_returns_unit_vectors_that_tell_texts_apart(system):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Interest rates rose in March."]
    job = system.client.wait(system.client.submit({"kind": "embed", "model": MODEL, "input": texts})["id"])
    assert job["status"] == "succeeded", job["error"]
    vectors = job["result"]["embeddings"]
    assert job["result"]["dimensions"] == 576 and [len(v) for v in vectors] == [576] * 3
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    assert vectors[0] == vectors[1]
    same_topic = sum(a * b for a, b in zip(vectors[0], vectors[2], strict=True))
    assert same_topic < 0.99

    alone = system.client.wait(system.client.submit({"kind": "embed", "model": MODEL, "input": texts[0]})["id"])
    cosine = sum(a * b for a, b in zip(alone["result"]["embeddings"][0], vectors[0], strict=True))
    assert cosine > 0.9999


def _wait_until_running(client, job_id, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if job["status"] != "queued":
            return job
        time.sleep(0.05)
    raise TimeoutError(job_id)


def test_cancelling_a_running_job_stops_it_at_the_next_token(system):
    counting = [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]
    body = {"model": MODEL, "messages": counting, "max_tokens": 1500, "temperature": 0}
    with system.client.stream_chat(body) as stream:
        pieces = iter(stream)
        first = next(pieces)  # its text is coming: the job runs, past its prompt
        requested = system.client.cancel(stream.job_id)
        assert requested["status"] in ("running", "cancelled") and requested["cancel_requested"]
        rest: list[str] = []
        with pytest.raises(ApiError, match=f"job {stream.job_id} was cancelled"):  # its stream says why it ends
            rest.extend(pieces)
    done = system.client.wait(stream.job_id, timeout_s=60)
    assert done["status"] == "cancelled" and done["result"]["finish_reason"] == "cancelled"
    assert done["result"]["text"] == first + "".join(rest)  # what was streamed is what was kept, no more
    assert 0 < done["completion_tokens"] < 1500


def test_a_queued_job_cancelled_behind_a_running_one_never_runs(system):
    running = system.client.submit(COUNTING)
    waiting = system.client.submit({"kind": "noop", "model": MODEL})
    _wait_until_running(system.client, running["id"])
    cancelled = system.client.cancel(waiting["id"])
    assert cancelled["status"] == "cancelled"
    system.client.cancel(running["id"])
    assert system.client.wait(running["id"], timeout_s=30)["status"] == "cancelled"
    after = system.client.job(waiting["id"])
    assert after["status"] == "cancelled" and after["started_at"] is None and after["attempts"] == 0
    try:
        system.client.cancel(waiting["id"])
    except ApiError as exc:
        assert exc.status == 409
    else:
        raise AssertionError("cancelling a cancelled job should be a conflict")


def test_the_cli_submits_waits_and_lists(system, tmp_path):
    cli = [sys.executable, "-m", "gpuq.cli"]
    keyless = {**os.environ, "GPUQ_DATA_DIR": str(tmp_path)}  # no admin.key file there
    env = {**keyless, "GPUQ_API_KEY": system.processes.admin_key}
    out = subprocess.run(
        [*cli, "submit", "--url", system.url, MODEL, "The sky is", "--max-tokens", "8", "--temperature", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    text = out.stdout.strip()
    assert text
    [latest] = system.client.jobs(limit=1)["data"]
    assert system.client.job(latest["id"])["result"]["text"].strip() == text
    table = subprocess.run(
        [*cli, "jobs", "--url", system.url, "--limit", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    assert table.splitlines()[0].split()[:5] == ["ID", "KIND", "MODEL", "PRIORITY", "STATUS"]
    assert latest["id"] in table and "succeeded" in table
    models = subprocess.run(
        [*cli, "models", "--url", system.url], capture_output=True, text=True, timeout=60, check=True, env=env
    ).stdout
    assert "smollm2-135m" in models and "generate,embed" in models
    bad = subprocess.run(
        [*cli, "submit", "--url", system.url, "nope", "hi"], capture_output=True, text=True, timeout=60, env=env
    )
    unknown = "error: model 'nope' is not registered (`gpuq models` or GET /v1/models lists those that are) (HTTP 404)"
    assert bad.returncode == 1 and unknown in bad.stderr
    anonymous = subprocess.run(
        [*cli, "jobs", "--url", system.url], capture_output=True, text=True, timeout=60, env=keyless
    )
    # One line that says where a key comes from (this environment has no GPUQ_API_KEY, no admin.key).
    assert anonymous.returncode == 1 and anonymous.stderr.startswith("error: no API key: set GPUQ_API_KEY")
    assert len(anonymous.stderr.strip().splitlines()) == 1
