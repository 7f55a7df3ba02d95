"""Batch benchmarks, each beside its baseline in the same run.

* Batch accept: a 50,000-line file uploaded over HTTP and accepted as a batch (every line
  checked and tokenised, rows inserted, jobs queued) against a bare bulk SQL insert of
  50,000 rows into the same table plus one Redis pipeline pushing the same ids.
* Embedding throughput: 512 one-text embedding lines through a gpuq batch (grouped into
  llama.cpp calls of 64 texts) against one direct llama-cpp-python call over the same
  texts; also 512 separate embedding jobs (no grouping).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import cast

import httpx
import llama_cpp
from redis import Redis
from sqlalchemy import Table, func, insert, select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, utcnow
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path
from gpuq.store import new_job_id
from gpuq.testing import GpuqProcesses

TOPICS = ["rivers", "bread", "trains", "music", "gardens", "clocks", "winter", "markets"]


def text(i: int) -> str:
    return f"Request {i}: a short note about {TOPICS[i % len(TOPICS)]} number {i}."


def write_chat_file(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": BUNDLED_MODEL_NAME, "messages": [{"role": "user", "content": text(i)}], "max_tokens": 16}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
            f.write("\n")


def write_embedding_file(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": BUNDLED_MODEL_NAME, "input": text(i)}
            f.write(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")


@dataclass
class AcceptResult:
    lines: int
    seconds: float


def accept_gpuq(database_url: str, redis_url: str, workdir: Path, lines: int) -> AcceptResult:
    path = workdir / "accept.jsonl"
    write_chat_file(path, lines)
    processes = GpuqProcesses(database_url, redis_url, workdir)
    try:
        _api, url = processes.start_api()
        auth = {"Authorization": f"Bearer {processes.admin_key}"}
        with httpx.Client(base_url=url, timeout=600, headers=auth) as http:
            started = time.perf_counter()
            with path.open("rb") as f:
                file = http.post("/v1/files", files={"file": (path.name, f)}, data={"purpose": "batch"}).json()
            batch = http.post(
                "/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}
            ).json()
            elapsed = time.perf_counter() - started
    finally:
        processes.stop_all()
    assert batch["request_counts"]["total"] == lines, batch
    queued = Redis.from_url(redis_url).llen("rq:queue:gpuq:smollm2-135m:generate:low")
    assert queued == lines, f"{queued} of {lines} queued"
    return AcceptResult(lines, elapsed)


def accept_bare(database_url: str, redis_url: str, lines: int) -> AcceptResult:
    """The floor: the same rows and queue entries with no checks, no RQ job hashes, nothing else."""
    engine = sync_engine(database_url)
    redis = Redis.from_url(redis_url)
    started = time.perf_counter()
    now = utcnow()
    rows = [
        {
            "id": new_job_id(),
            "kind": "generate",
            "model": BUNDLED_MODEL_NAME,
            "priority": 2,
            "status": "queued",
            "request_hash": "",
            "request": {"messages": [{"role": "user", "content": text(i)}], "max_tokens": 16},
            "created_at": now,
            "attempts": 0,
            "line_count": 1,
        }
        for i in range(lines)
    ]
    with sync_sessions(engine)() as session:
        session.execute(insert(cast(Table, Job.__table__)), rows)  # the same Core insert gpuq uses
        session.commit()
    with redis.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.rpush("bench:bare-queue", str(row["id"]))
        pipe.execute()
    elapsed = time.perf_counter() - started
    with sync_sessions(engine)() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == lines
    engine.dispose()
    redis.close()
    return AcceptResult(lines, elapsed)


@dataclass
class EmbedResult:
    texts: int
    seconds: float

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds


def embed_direct(texts: list[str], threads: int) -> EmbedResult:
    llm = llama_cpp.Llama(
        model_path=str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        n_batch=BUNDLED_CONTEXT_LENGTH,
        n_ubatch=BUNDLED_CONTEXT_LENGTH,
        n_threads=threads,
        n_threads_batch=threads,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        verbose=False,
    )
    llm.embed(texts[:4])  # warm up, as the gpuq side's model is loaded before its clock starts
    started = time.perf_counter()
    vectors = llm.embed(texts, normalize=True)
    elapsed = time.perf_counter() - started
    llm.close()
    assert len(vectors) == len(texts)
    return EmbedResult(len(texts), elapsed)


def _wait_finished(database_url: str, *, batch_id: str | None = None, ids: list[str] | None = None) -> datetime:
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    query = select(func.count()).select_from(Job).where(Job.finished_at.is_(None))
    query = query.where(Job.batch_id == batch_id) if batch_id else query.where(Job.id.in_(ids or []))
    last = select(func.max(Job.finished_at)).where(Job.batch_id == batch_id if batch_id else Job.id.in_(ids or []))
    try:
        while True:
            with sessions() as session:
                if session.scalar(query) == 0:
                    return session.scalar(last)
            time.sleep(0.5)
    finally:
        engine.dispose()


def embed_gpuq(
    database_url: str, redis_url: str, workdir: Path, texts: list[str], threads: int, *, grouped: bool
) -> EmbedResult:
    processes = GpuqProcesses(database_url, redis_url, workdir, settings={"GPUQ_WORKER_THREADS": str(threads)})
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        with processes.client(url) as client:
            client.wait(client.submit({"kind": "embed", "model": BUNDLED_MODEL_NAME, "input": "warm up"})["id"])
            if grouped:
                path = workdir / "embed.jsonl"
                write_embedding_file(path, len(texts))
                started = utcnow()
                batch = client.create_batch(client.upload(str(path))["id"], endpoint="/v1/embeddings")
                finished = _wait_finished(database_url, batch_id=batch["id"])
            else:
                started = utcnow()
                ids = [
                    j["id"]
                    for j in client.submit_many(
                        [{"kind": "embed", "model": BUNDLED_MODEL_NAME, "input": t} for t in texts]
                    )
                ]
                finished = _wait_finished(database_url, ids=ids)
    finally:
        processes.stop_all()
    return EmbedResult(len(texts), (finished - started).total_seconds())
