"""Model-swap workload: three models, two workers each with room for one model, 60 jobs in
the order A B C A B C ... Model loads and makespan for gpuq against plain FIFO RQ workers
on the same jobs, in the same run.

The three models are copies of the bundled SmolLM2 under three names; each is registered
with a 20 GiB VRAM figure on a simulated host of two 24 GiB GPUs, so a worker holds one at
a time. The FIFO baseline is what a plain RQ deployment does: one queue, jobs in arrival
order, each worker keeping its last model and loading whatever the next job needs.
Jobs are short (one token) so that, as with big models on real GPUs, loading dominates.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.job import Job as RQJob
from rq.registry import FinishedJobRegistry
from sqlalchemy import func, select

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, utcnow
from gpuq.registry.bundled import require_bundled_model_path
from gpuq.testing import GpuqProcesses

MODELS = ("swap-a", "swap-b", "swap-c")
JOBS = 60
VRAM_MIB = 20 * 1024
FIFO_QUEUE = "bench-fifo"


@dataclass
class SwapResult:
    loads: int
    makespan_s: float


def _jobs() -> list[tuple[str, str]]:
    return [(MODELS[i % len(MODELS)], f"Say the number {i}.") for i in range(JOBS)]


def run_gpuq(database_url: str, redis_url: str, workdir: Path) -> SwapResult:
    settings = {
        "GPUQ_SIMULATED_GPUS": "24,24",
        "GPUQ_WORKER_THREADS": "1",
        "GPUQ_WORKER_MAX_LOADED_MODELS": "3",  # the VRAM budget, not the count, is what binds
        "GPUQ_WORKER_REFRESH_INTERVAL_S": "1",
    }
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    try:
        _api, url = processes.start_api()
        with processes.client(url) as client:
            for name in MODELS:
                (workdir / "models" / f"{name}.gguf").symlink_to(require_bundled_model_path())
                client.register_model({"name": name, "path": f"{name}.gguf", "vram_mib": VRAM_MIB})
            processes.start_supervisor(expected_workers=2)
            body = [
                {"kind": "generate", "model": m, "prompt": p, "max_tokens": 1, "temperature": 0} for m, p in _jobs()
            ]
            started = utcnow()
            ids = [j["id"] for j in client.submit_many(body)]
            wait_until_finished(database_url, ids)
            done = [client.job(i) for i in ids]
    finally:
        processes.stop_all()
    assert all(j["status"] == "succeeded" for j in done), [j["error"] for j in done if j["error"]]
    finished = max(datetime.fromisoformat(j["finished_at"]) for j in done)
    return SwapResult(sum(1 for j in done if j["load_ms"]), (finished - started).total_seconds())


def wait_until_finished(database_url: str, ids: list[str], poll_s: float = 0.2) -> None:
    """Poll SQL, not the API: a poller must not compete with the workers for the CPU."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    try:
        while True:
            with sessions() as session:
                pending = session.scalar(
                    select(func.count()).select_from(Job).where(Job.id.in_(ids), Job.finished_at.is_(None))
                )
            if not pending:
                return
            time.sleep(poll_s)
    finally:
        engine.dispose()


def run_fifo(redis_url: str) -> SwapResult:
    redis = Redis.from_url(redis_url)
    queue = Queue(FIFO_QUEUE, connection=redis)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _FIFO_WORKER, redis_url, FIFO_QUEUE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    time.sleep(3)  # both started and waiting on the queue
    path = str(require_bundled_model_path())
    started = utcnow()
    jobs = queue.enqueue_many(
        [Queue.prepare_data("bench.fifo_job.generate", args=(m, path, p), result_ttl=600) for m, p in _jobs()]
    )
    finished = FinishedJobRegistry(queue=queue)
    while finished.count < JOBS:
        time.sleep(0.2)
    fetched = RQJob.fetch_many([j.id for j in jobs], connection=redis)
    for worker in workers:
        worker.terminate()
        worker.wait()
    redis.close()
    loads = sum(1 for j in fetched if j is not None and j.return_value())
    end = max(j.ended_at for j in fetched if j is not None and j.ended_at is not None)
    return SwapResult(loads, (end - started).total_seconds())


_FIFO_WORKER = """
import sys
from redis import Redis
from rq import Queue, SimpleWorker
redis = Redis.from_url(sys.argv[1])
SimpleWorker([Queue(sys.argv[2], connection=redis)], connection=redis).work(logging_level="WARNING")
"""
