"""Starting a batch reads its file as a stream (issue 24 item 9): the lines are checked, then
read again into jobs a chunk at a time, so what the API holds while it plans does not grow
with the file; the jobs, their order in the queue and the embedding groups are as before."""

import json
import tracemalloc
from pathlib import Path

from gpuq import store
from gpuq.batches.schedules import store_inline_requests
from gpuq.batches.service import EMBED_GROUP_TEXTS, start_batch
from gpuq.db.tables import Job
from tests.conftest import both_databases

MODEL = "smollm2-135m"


def chat(i: int, size: int = 40) -> dict:
    content = f"line {i} " + "x" * size
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def embed(i: int, texts: int = 1) -> dict:
    body = {"model": MODEL, "input": [f"text {i}.{t}" for t in range(texts)]}
    return {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


def start(session, redis, directory: Path, lines: list[dict]):
    file = store.save_file(session, store_inline_requests(lines, directory))
    return start_batch(
        session,
        redis,
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=None,
        priority=2,
        timeout_s=60,
    )


@both_databases
def test_a_mixed_batch_becomes_the_same_jobs_queued_in_input_order(session, redis, tmp_path):
    # embedding lines of 30 texts: two fit a group of 64, the third starts the next
    lines = [embed(0, 30), chat(1), embed(2, 30), chat(3), embed(4, 30), embed(5, 1), chat(6)]
    batch = start(session, redis, tmp_path, lines)
    jobs = session.query(Job).filter(Job.batch_id == batch.id).order_by(Job.line_number).all()
    assert [(j.kind, j.line_number, j.line_count) for j in jobs] == [
        ("embed", 1, 2),  # lines 1 and 3, 60 texts
        ("generate", 2, 1),
        ("generate", 4, 1),
        ("embed", 5, 2),  # lines 5 and 6
        ("generate", 7, 1),
    ]
    assert jobs[0].request["custom_ids"] == ["e0", "e2"] and len(jobs[0].request["input"]) == 60 <= EMBED_GROUP_TEXTS
    assert [j.custom_id for j in jobs if j.kind == "generate"] == ["c1", "c3", "c6"]
    queued = [x.decode() for q in sorted(redis.keys("rq:queue:*")) for x in redis.lrange(q, 0, -1)]
    by_line = {j.id: j.line_number for j in jobs}
    generate = [i for i in queued if i in by_line and session.get(Job, i).kind == "generate"]
    assert [by_line[i] for i in generate] == [2, 4, 7]  # first in, first out, within a queue
    assert batch.total == len(lines)


def test_planning_a_big_batch_holds_a_chunk_of_it_not_the_whole_file(session, redis, tmp_path):
    """6,000 lines of ~1.5 KB (9.5 MB): holding the lines, then their jobs' rows, took twice
    the file's size and more; streamed, the peak is a chunk of lines and what each job needs
    in Redis (about half the file here, the same for a file of any line length)."""
    lines = [chat(i, size=1500) for i in range(6_000)]
    file = store.save_file(session, store_inline_requests(lines, tmp_path))
    size = Path(file.path).stat().st_size
    tracemalloc.start()
    try:
        batch = start_batch(
            session,
            redis,
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata=None,
            priority=2,
            timeout_s=600,
        )
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert session.query(Job).filter(Job.batch_id == batch.id).count() == 6_000
    assert peak < size, f"planning held {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
    assert json.loads(Path(file.path).read_text().splitlines()[0])["custom_id"] == "c0"
