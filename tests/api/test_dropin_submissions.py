"""A drop-in call refused after its limits could be checked spends none of its key's
submissions (issue 24 item 4: gpuq/dropin/call.py admitted once itself, then submit_jobs
admitted again), on both databases."""

import pytest

from tests.api.conftest import bearer
from tests.conftest import both_databases

MODEL = "smollm2-135m"
LONG = "word " * 2100  # more tokens than the model's context of 2048
NOOP = {"kind": "noop", "model": MODEL}


@both_databases
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9999}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 9999}),
        ("/v1/embeddings", {"model": MODEL, "input": LONG}),
        ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 9999}}),
        ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                       "options": {"num_predict": 9999}}),
        ("/api/embed", {"model": MODEL, "input": LONG}),
        ("/api/embeddings", {"model": MODEL, "prompt": LONG}),
    ],
)  # fmt: skip
def test_a_refused_drop_in_call_spends_no_submission(client, make_key, job_rows, path, body):
    key = make_key("submitter", "acme", max_submissions_per_minute=1)
    refused = client.post(path, json=body, headers=bearer(key))
    assert refused.status_code == 400, refused.text
    # The key's one submission a minute is still there.
    assert client.post("/v1/jobs", json=NOOP, headers=bearer(key)).status_code == 202
    assert client.post("/v1/jobs", json=NOOP, headers=bearer(key)).status_code == 429
    assert len(job_rows()) == 1
