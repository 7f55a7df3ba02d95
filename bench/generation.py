"""Generation overhead: tokens/s of 20 generation jobs through gpuq against the same prompts
run directly with llama-cpp-python in one process, same model, same threads, same tokens.

Both sides load the model before the clock starts (gpuq with one warm-up job), so the
figure is the steady-state cost of going through HTTP, Redis, the worker and SQL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import llama_cpp
from sqlalchemy import func, select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, utcnow
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path
from gpuq.testing import GpuqProcesses

PROMPTS = [
    f"Write a short paragraph about {topic}."
    for topic in (
        "the sea",
        "mountains",
        "a city at night",
        "bread",
        "rain",
        "a library",
        "trains",
        "the moon",
        "autumn",
        "a garden",
        "bicycles",
        "the desert",
        "music",
        "a market",
        "snow",
        "bridges",
        "coffee",
        "the forest",
        "a lighthouse",
        "clocks",
    )
]
SEED = 7


@dataclass
class GenerationResult:
    completion_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds


def run_direct(*, threads: int, max_tokens: int, gpu_layers: int = 0) -> GenerationResult:
    llm = llama_cpp.Llama(
        n_gpu_layers=gpu_layers,
        model_path=str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,  # as gpuq's workers have it by default: the same tokens on both sides
        verbose=False,
    )
    tokens = 0
    started = time.perf_counter()
    for prompt in PROMPTS:
        out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=SEED)
        assert isinstance(out, dict)  # not streamed
        tokens += out["usage"]["completion_tokens"]
    elapsed = time.perf_counter() - started
    llm.close()
    return GenerationResult(tokens, elapsed)


def run_gpuq(
    database_url: str, redis_url: str, workdir: Path, *, threads: int, max_tokens: int, gpus: str | None = None
) -> GenerationResult:
    body = {"kind": "generate", "model": BUNDLED_MODEL_NAME, "max_tokens": max_tokens, "temperature": 0.0}
    jobs = [body | {"prompt": p, "top_p": 1.0, "seed": SEED} for p in PROMPTS]
    # One slot: this measures the cost of the path around one sequence (bench batching runs K > 1).
    settings = {"GPUQ_WORKER_THREADS": str(threads), "GPUQ_WORKER_SLOTS": "1"}
    started, done = run_through_gpuq(database_url, redis_url, workdir, jobs, settings=settings, gpus=gpus)
    # The clock stops when the worker recorded the last job finished, not when we looked.
    elapsed = (max(datetime.fromisoformat(j["finished_at"]) for j in done) - started).total_seconds()
    return GenerationResult(sum(j["completion_tokens"] for j in done), elapsed)


def run_through_gpuq(
    database_url: str,
    redis_url: str,
    workdir: Path,
    jobs: list[dict[str, Any]],
    *,
    settings: dict[str, str],
    gpus: str | None = None,
) -> tuple[datetime, list[dict[str, Any]]]:
    """Submits ``jobs`` at once to an API and one worker (model loaded first) and waits for
    them all; returns when they were submitted and the finished jobs."""
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    try:
        _api, url = processes.start_api()
        processes.start_worker(gpus=gpus)
        with processes.client(url) as client:
            client.wait(client.submit(jobs[0] | {"max_tokens": 1})["id"])  # loads the model
            started = utcnow()
            ids = [j["id"] for j in client.submit_many(jobs)]
            while True:  # polled rarely: the poller must not steal CPU from llama.cpp's threads
                with sessions() as session:
                    pending = session.scalar(
                        select(func.count()).select_from(Job).where(Job.id.in_(ids), Job.finished_at.is_(None))
                    )
                if pending == 0:
                    break
                time.sleep(1.0)
            done = [client.job(i) for i in ids]
    finally:
        processes.stop_all()
        engine.dispose()
    assert all(j["status"] == "succeeded" for j in done), [j["error"] for j in done]
    return started, done
