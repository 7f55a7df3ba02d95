"""A lone UTF-16 surrogate anywhere in a request body is refused in the route's own shape,
and nothing is written (issue 24 item 3: seven routes answered 500, or queued a job that
failed in the worker), on both databases."""

import pytest

from tests.api.conftest import redis_job_keys
from tests.conftest import both_databases

MODEL = "smollm2-135m"
LONE = '"a\\udfff"'  # as JSON spells it: Python's parser keeps the lone surrogate


@both_databases
@pytest.mark.parametrize(
    ("path", "body", "status", "where"),
    [
        ("/v1/embeddings", f'{{"model": "{MODEL}", "input": [{LONE}]}}', 400, "input[0]"),
        ("/v1/jobs", f'{{"jobs": [{{"kind": "embed", "model": "{MODEL}", "input": [{LONE}]}}]}}', 422, "jobs[0].input[0]"),  # noqa: E501
        ("/api/embed", f'{{"model": "{MODEL}", "input": [{LONE}]}}', 400, "input[0]"),
        ("/api/embeddings", f'{{"model": "{MODEL}", "prompt": {LONE}}}', 400, "prompt"),
        ("/api/show", f'{{"model": {LONE}}}', 400, "model"),
        ("/api/pull", f'{{"model": {LONE}}}', 400, "model"),
        ("/api/generate", f'{{"model": "{MODEL}", "prompt": "hi", "options": {{"stop": [{LONE}]}}}}', 400, "options.stop[0]"),  # noqa: E501
        ("/v1/chat/completions", f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {LONE}}}]}}', 400, "messages[0].content"),  # noqa: E501
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_refused_in_the_routes_shape_and_nothing_is_written(
    client, redis, job_rows, path, body, status, where
):
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    message = response.json()["error"] if path.startswith("/api/") else response.json()["error"]["message"]
    assert f"`{where}` contains a lone UTF-16 surrogate" in message
    assert job_rows() == [] and redis_job_keys(redis) == []


def test_a_surrogate_pair_is_text_and_goes_through(client, job_rows):
    body = f'{{"kind": "embed", "model": "{MODEL}", "input": ["\\ud83d\\ude00"]}}'
    response = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 202, response.text
    assert job_rows()[0].request["input"] == ["\N{GRINNING FACE}"]
