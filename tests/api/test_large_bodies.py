"""A key's large bodies are handled one at a time (api/large_bodies.py), but only through
their costly part: a call whose job is submitted, and which waits for it, holds nothing."""

import threading
import time

import pytest

from tests.api.conftest import bearer
from tests.conftest import both_databases

MODEL = "smollm2-135m"


@pytest.fixture
def settings(settings):
    """gpuq's default body limit (1 MiB): the bodies here are over 64 KiB."""
    return settings.model_copy(update={"max_body_bytes": 1024 * 1024})


def in_thread(send) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(send()), daemon=True)
    thread.start()
    return thread, answers


@both_databases
def test_a_large_call_waiting_for_its_job_does_not_hold_up_its_keys_next_large_body(client, make_key, job_rows):
    key = make_key("submitter", "acme")
    # a large body (padding in `user`, which the call ignores) with a short prompt: it is queued,
    # and no worker runs here, so the call waits for its job
    waiting = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "user": "x" * 100_000}
    first, first_answer = in_thread(lambda: client.post("/v1/chat/completions", json=waiting, headers=bearer(key)))
    deadline = time.monotonic() + 30
    while not job_rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    [job] = job_rows()

    # the same key's next large body (a bulk of 1,000 jobs, ~100 KB) is read and answered meanwhile
    bulk = {"jobs": [{"kind": "noop", "model": MODEL, "idempotency_key": f"{i:04d}-" + "k" * 80} for i in range(1000)]}
    second, second_answer = in_thread(lambda: client.post("/v1/jobs/bulk", json=bulk, headers=bearer(key)))
    second.join(60)
    answered_meanwhile, first_waiting = not second.is_alive(), first.is_alive()

    assert client.post(f"/v1/jobs/{job.id}/cancel").status_code == 200  # ends the first call (and the test)
    first.join(30)
    second.join(30)
    assert answered_meanwhile and first_waiting, "the key's next large body waited for the first call's answer"
    assert second_answer[0].status_code == 202
    assert first_answer and first_answer[0].status_code == 409  # cancelled by someone else
