"""Input an attacker or a careless client sends: ids past the columns' range, NUL
characters, deeply nested JSON. Each is a 422 that says what is wrong, on both databases
(PostgreSQL is where they used to be 500s), and leaves no row, file or queue entry."""

import json

import pytest

from gpuq.db.tables import AffinityRule, ApiKey, File, Schedule
from gpuq.json_checks import MAX_DEPTH
from tests.api.conftest import redis_job_keys
from tests.api.test_batches_api import line, stored_files, table, upload
from tests.conftest import both_databases

MODEL = "smollm2-135m"
GEN = {"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 4}
TOO_BIG = 2**31  # one past PostgreSQL's INTEGER


def refused(response, *words: str) -> str:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    for word in words:
        assert word in detail, detail
    return detail


@both_databases
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/v1/schedules/{TOO_BIG}"),
        ("PATCH", f"/v1/schedules/{TOO_BIG}"),
        ("DELETE", f"/v1/schedules/{TOO_BIG}"),
        ("POST", f"/v1/schedules/{TOO_BIG}/pause"),
        ("GET", f"/v1/schedules/{TOO_BIG}/runs"),
        ("PUT", f"/v1/affinity-rules/{TOO_BIG}"),
        ("DELETE", f"/v1/affinity-rules/{TOO_BIG}"),
        ("GET", "/v1/schedules/-1"),
    ],
)
def test_an_id_past_the_columns_range_is_a_422(client, method, path):
    body = {"model_pattern": "*", "effect": "allow"} if method == "PUT" else {} if method == "PATCH" else None
    bound = "greater than or equal to 1" if path.endswith("/-1") else "less than or equal to 2147483647"
    refused(client.request(method, path, json=body), "_id: Input should be", bound)  # names the id, says the bound


@both_databases
@pytest.mark.parametrize(
    ("path", "body", "table_"),
    [
        ("/v1/affinity-rules", {"model_pattern": "*", "effect": "allow", "min_memory_mib": TOO_BIG}, AffinityRule),
        ("/v1/keys", {"name": "k", "owner": "t", "max_queued_jobs": TOO_BIG}, ApiKey),
        ("/v1/keys", {"name": "k", "owner": "t", "max_submissions_per_minute": 10**30}, ApiKey),
    ],
)
def test_a_number_past_the_columns_range_is_a_422_and_stores_nothing(client, session, path, body, table_):
    before = len(table(session, table_))
    refused(client.post(path, json=body), "less than or equal to 2147483647")
    assert len(table(session, table_)) == before


@both_databases
@pytest.mark.parametrize(
    ("method", "path", "params", "where"),
    [
        ("GET", "/v1/jobs/job_%00x", None, "path parameter `job_id`"),
        ("POST", "/v1/jobs/job_%00x/cancel", None, "path parameter `job_id`"),
        ("GET", "/v1/batches/batch_%00", None, "path parameter `batch_id`"),
        ("GET", "/v1/files/file-%00", None, "path parameter `file_id`"),
        ("GET", "/v1/models/smol%00", None, "path parameter `name`"),
        ("DELETE", "/v1/keys/key_%00", None, "path parameter `key_id`"),
        ("POST", "/v1/gpus/GPU-%00/clear", None, "path parameter `uuid`"),
        ("GET", "/v1/jobs", {"model": "smol\x00"}, "query parameter `model`"),
        ("GET", "/v1/jobs", {"after": "job_\x00"}, "query parameter `after`"),
        ("GET", "/v1/webhooks/deliveries", {"job_id": "\x00"}, "query parameter `job_id`"),
        ("GET", "/v1/affinity-rules/preview", {"model": "\x00"}, "query parameter `model`"),
        ("GET", "/v1/stats/summary", {"tenant": "a\x00"}, "query parameter `tenant`"),
    ],
)
def test_a_nul_character_in_the_url_is_a_422_that_says_where(client, method, path, params, where):
    refused(client.request(method, path, params=params), where, "NUL character")


def test_a_query_parameter_a_route_does_not_read_is_ignored_whatever_it_holds(client):
    """Its 422 would be an answer the route does not declare, for text that reaches nothing."""
    assert client.get("/v1/models", params={"junk": "a\x00"}).status_code == 200
    assert client.get("/v1/jobs", params={"junk": "a\x00", "limit": 1}).status_code == 200


@both_databases
@pytest.mark.parametrize(
    ("body", "where"),
    [
        (GEN | {"model": "smol\x00"}, "`model`"),
        (GEN | {"prompt": "a\x00b"}, "`prompt`"),
        (GEN | {"idempotency_key": "k\x00"}, "`idempotency_key`"),
        (
            {"kind": "generate", "model": MODEL, "messages": [{"role": "user", "content": "\x00"}]},
            "`messages[0].content`",
        ),
        ({"kind": "embed", "model": MODEL, "input": ["fine", "bad\x00"]}, "`input[1]`"),
    ],
)
def test_a_nul_character_in_a_job_is_a_422_and_queues_nothing(client, redis, job_rows, body, where):
    refused(client.post("/v1/jobs", json=body), where, "NUL character")
    assert job_rows() == [] and redis_job_keys(redis) == []


@both_databases
def test_a_nul_character_anywhere_in_a_bulk_or_a_key_is_refused(client, session, job_rows):
    refused(client.post("/v1/jobs/bulk", json={"jobs": [GEN, GEN | {"model": "\x00"}]}), "`jobs[1].model`")
    refused(client.post("/v1/keys", json={"name": "n\x00", "owner": "t"}), "`name`")
    assert job_rows() == [] and len(table(session, ApiKey)) == 1  # the admin's own


def multipart(filename: str, content: str, boundary: str = "gpuq-test") -> tuple[bytes, dict[str, str]]:
    """An upload written by hand: httpx would percent-encode a NUL in the file name, a client need not."""
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n\r\n'
        f"{content}\r\n--{boundary}--\r\n"
    )
    return body.encode(), {"content-type": f"multipart/form-data; boundary={boundary}"}


@both_databases
def test_an_upload_whose_name_holds_a_nul_character_keeps_no_file_and_no_row(client, session, settings):
    body, headers = multipart("in\x00.jsonl", line("a") + "\n")
    refused(client.post("/v1/files", content=body, headers=headers), "file name", "NUL character")
    assert table(session, File) == [] and stored_files(settings) == []


@both_databases
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            json.dumps({"custom_id": "a\x00", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL}}),
            "`custom_id`",
        ),
        (line("a", model="smol\x00"), "`body.model`"),
        (line("a", messages=[{"role": "user", "content": "x\x00"}]), "`body.messages[0].content`"),
        (line("a", metadata={"k\x00": 1}), "`body.metadata.k"),
    ],
)
def test_a_nul_character_in_a_batch_line_is_refused_at_upload(client, session, settings, content, message):
    refused(upload(client, content), "line 1:", message, "NUL character")
    assert table(session, File) == [] and stored_files(settings) == []


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 200_000])
def test_a_deeply_nested_batch_line_is_refused_at_upload(client, session, settings, depth):
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "{MODEL}", "input": {nested}}}'
    content = f'{{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {body}}}'
    refused(upload(client, content), "line 1:", f"nested more than {MAX_DEPTH} levels deep")
    assert table(session, File) == [] and stored_files(settings) == []


def test_a_batch_line_nested_within_the_limit_is_accepted_at_upload(client):
    nested = "[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3)  # the line, body and extra field are 3 levels
    content = line("a")[:-1] + f', "extra": {nested}}}'
    assert upload(client, content).status_code == 200


@both_databases
def test_a_deeply_nested_json_body_is_refused_and_stores_nothing(client, session, settings):
    deep: object = "x"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    request = json.loads(line("a")) | {"body": json.loads(line("a"))["body"] | {"extra": deep}}
    schedule = {"name": "deep", "cron": "0 2 * * *", "requests": [request]}
    refused(client.post("/v1/schedules", json=schedule), f"nested more than {MAX_DEPTH} levels deep")
    assert table(session, Schedule) == [] and table(session, File) == []
