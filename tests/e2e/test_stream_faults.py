"""Interactive calls when their worker dies mid-answer, caused for real (SIGKILL): no job is
lost, a waiting call gets the retried run's answer, and a stream that already sent text says
plainly that the job started over rather than splicing two runs together."""

import threading
import time

import ollama
import openai
import pytest

from tests.e2e.conftest import reconcile

MODEL = "smollm2-135m"
COUNT = "Count from 1 to 1000: 1, 2, 3,"


def _wait_running(client, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = client.jobs(status=["running"], limit=1)["data"]
        if jobs:
            return jobs[0]
        time.sleep(0.05)
    raise AssertionError("no job started running")


def _kill_and_recover(processes, doomed, job_id: str) -> str:
    doomed.kill()  # SIGKILL: no outcome, no goodbye
    time.sleep(2.5)  # its RQ key expires after its TTL
    assert reconcile(processes).recovered == [job_id]
    _survivor, name = processes.start_worker("survivor")
    return name


def test_a_stream_whose_worker_dies_ends_with_an_error_and_the_job_runs_again(processes):
    processes.settings |= {"GPUQ_WORKER_TTL_S": "2", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}
    _api, url = processes.start_api()
    doomed, _name = processes.start_worker("doomed")
    body = {"model": MODEL, "prompt": COUNT, "max_tokens": 200, "temperature": 0}
    with openai.OpenAI(base_url=f"{url}/v1", api_key=processes.admin_key, max_retries=0) as client:
        stream = client.completions.create(**body, stream=True)
        chunks = iter(stream)
        first = next(chunks)
        job_id = first.id.split("-", 1)[1]
        survivor = _kill_and_recover(processes, doomed, job_id)
        with pytest.raises(openai.APIError, match=f"job {job_id} stopped; the job is running again .attempt 2."):
            for _chunk in chunks:
                pass
    with processes.client(url) as gpuq:
        done = gpuq.wait(job_id, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempts"] == 2 and done["worker"] == survivor
    assert done["completion_tokens"] == 200


def test_a_waiting_call_whose_worker_dies_gets_the_retried_runs_answer(processes):
    processes.settings |= {"GPUQ_WORKER_TTL_S": "2", "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}
    _api, url = processes.start_api()
    doomed, _name = processes.start_worker("doomed")
    client = ollama.Client(host=url, headers={"Authorization": f"Bearer {processes.admin_key}"})
    answer: dict = {}
    call = threading.Thread(
        target=lambda: answer.update(
            response=client.generate(
                model=MODEL, prompt=COUNT, raw=True, options={"num_predict": 200, "temperature": 0}
            )
        )
    )
    call.start()
    with processes.client(url) as gpuq:
        job = _wait_running(gpuq)
        time.sleep(0.5)
        _kill_and_recover(processes, doomed, job["id"])
        call.join(timeout=240)
        done = gpuq.job(job["id"])
    assert not call.is_alive()
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert (
        answer["response"].response == done["result"]["text"]
        and answer["response"].eval_count == done["completion_tokens"]
    )
