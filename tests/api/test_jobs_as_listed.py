"""Jobs as people look for them: each listed with a snippet of what it asks (or its batch
line's custom_id) and its batch, a running job of a streaming call with its tokens so far
(from its token stream), and a batch whose lines mix endpoints saying so."""

from datetime import UTC, datetime

from sqlalchemy import update

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.streams.events import Delta, Start
from gpuq.streams.publish import StreamPublisher
from tests.api.test_batches_api import MODEL, create, line, upload
from tests.conftest import both_databases

LONG = "Write a long story about a lighthouse keeper who finds a message in a bottle, " * 3


def _listed(client, **params):
    return {j["id"]: j for j in client.get("/v1/jobs", params=params).json()["data"]}


@both_databases
def test_each_job_is_listed_with_a_snippet_of_what_it_asks_and_its_batch(client):
    prompt = client.post("/v1/jobs", json={"kind": "generate", "model": MODEL, "prompt": LONG, "max_tokens": 4})
    chat = client.post(
        "/v1/jobs",
        json={
            "kind": "generate",
            "model": MODEL,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name  a\ncolour."}],
            "max_tokens": 4,
        },
    )
    embed = client.post("/v1/jobs", json={"kind": "embed", "model": MODEL, "input": ["first text", "second", "third"]})
    batch = create(client, upload(client, line("ticket-4711")).json()["id"]).json()
    listed = _listed(client)
    snippet = listed[prompt.json()["id"]]["snippet"]
    assert len(snippet) == 80 and snippet.endswith("…") and LONG.startswith(snippet[:-1])
    assert listed[chat.json()["id"]]["snippet"] == "Name a colour."  # the last message, on one line
    assert listed[embed.json()["id"]]["snippet"] == "first text (+2 more)"
    [from_batch] = [j for j in listed.values() if j["batch_id"] == batch["id"]]
    assert from_batch["snippet"] == "ticket-4711"  # a batch line is known by its custom_id
    assert client.get(f"/v1/jobs/{embed.json()['id']}").json()["snippet"] == "first text (+2 more)"


@both_databases
def test_a_running_streaming_job_is_listed_with_its_tokens_so_far(client, redis, database_url):
    streaming, plain = (
        client.post("/v1/jobs", json={"kind": "generate", "model": MODEL, "prompt": "hi", "max_tokens": 64}).json()[
            "id"
        ]
        for _ in range(2)
    )
    engine = sync_engine(database_url)
    with sync_sessions(engine)() as s:  # as a worker claims them; the first asked for a token stream (a drop-in call)
        started = {"status": "running", "worker": "node1.gpu0.1.ab", "started_at": datetime.now(UTC)}
        s.execute(update(Job).where(Job.id.in_([streaming, plain])).values(**started))
        row = s.get(Job, streaming)
        s.execute(update(Job).where(Job.id == streaming).values(request=row.request | {"events": "tokens"}))
        s.commit()
    engine.dispose()
    publisher = StreamPublisher(redis)  # the worker's side: the start, then text as it is decoded
    publisher.start(streaming, Start(attempt=1, prompt_tokens=2), max_tokens=64)
    publisher.deltas([(streaming, Delta("Once", 1))])
    publisher.deltas([(streaming, Delta(" upon a", 2)), (streaming, Delta(" time", 1))], now=True)
    listed = _listed(client, status="running")
    assert listed[streaming]["tokens_so_far"] == 4
    assert listed[plain]["tokens_so_far"] is None  # no stream: only its elapsed time can be shown
    assert _listed(client)[streaming]["tokens_so_far"] == 4


@both_databases
def test_a_batch_whose_lines_mix_endpoints_lists_them_all(client):
    embedding = '{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "%s", "input": "x"}}'
    mixed = create(client, upload(client, line("c") + "\n" + embedding % MODEL).json()["id"]).json()
    plain = create(client, upload(client, line("a") + "\n" + line("b")).json()["id"]).json()
    assert (mixed["endpoint"], mixed["endpoints"]) == (
        "/v1/chat/completions",
        ["/v1/chat/completions", "/v1/embeddings"],
    )
    assert plain["endpoints"] == ["/v1/chat/completions"]
    listed = {b["id"]: b["endpoints"] for b in client.get("/v1/batches").json()["data"]}
    assert listed == {mixed["id"]: mixed["endpoints"], plain["id"]: ["/v1/chat/completions"]}
