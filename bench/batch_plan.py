"""A batch queued in file order against the same batch planned (issue 42 item 3).

The batch: ``families`` prompt families, each its own ~450-token few-shot start
(``bench.peer.family_start``, W3's), ``per_family`` questions each, interleaved as a batch file
often has them (W3 itself at the defaults, 8 x 8: 64 lines; ``--plan-grouped``: each family's
lines together), greedy, ``max_tokens`` each, as ``/v1/completions`` lines of one batch, on one
worker with K slots and its prefix cache's RAM tier at its default (``--plan-ram-bytes``: 0
turns it off).

Two sides, same file, same worker settings, one after the other on fresh state:

* **file order**: the API with ``GPUQ_BATCH_PLAN=false``, so the lines are queued as the file
  has them (what gpuq did before planning);
* **planned**: the API as it is by default (``gpuq/batches/planning.py``).

Reported for each: the share of all prompt tokens the worker took from a cache (a KV stream or
its RAM tier; the jobs' own ``cached_tokens`` over their ``prompt_tokens``) and jobs per second
from the batch's creation to its last job's finish (target: planned >= 0.7 of the prompt tokens
from cache, and >= 2x the jobs per second of file order).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.batching import PROMPTS as SUBJECTS
from bench.peer import family_start
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Batch, Job, utcnow
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

SEED = 7


@dataclass(frozen=True)
class Side:
    jobs: int
    prompt_tokens: int
    cached_tokens: int
    cached_ram_tokens: int
    seconds: float
    groups: int | None  # the batch's plan: starts shared (None: not planned)

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def prompts(families: int, per_family: int, *, grouped: bool = False) -> list[str]:
    """W3's lines (``bench.peer.W3`` at 8 x 8): question ``q`` of every family, then ``q + 1``;
    ``grouped``: the same lines, each family's together (a file sorted by its start)."""
    lines = [
        f"{family_start(f)}Question: In one sentence, what is special about "
        f"{SUBJECTS[(q * families + f) % len(SUBJECTS)]}?\nAnswer:"
        for q in range(per_family)
        for f in range(families)
    ]
    if grouped:  # line i is family i % families's; sorted is stable, so questions keep their order
        return [lines[i] for i in sorted(range(len(lines)), key=lambda i: i % families)]
    return lines


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    """A greedy ``/v1/completions`` request of the bundled model."""
    return {
        "model": BUNDLED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "top_p": 1.0,
        "seed": SEED,
    }


def write_file(path: Path, lines: list[str], max_tokens: int) -> None:
    with path.open("w") as f:
        for i, prompt in enumerate(lines):
            line = {"custom_id": f"q{i}", "method": "POST", "url": "/v1/completions"}
            f.write(json.dumps(line | {"body": body(prompt, max_tokens)}) + "\n")


def run(
    database_url: str,
    redis_url: str,
    workdir: Path,
    *,
    planned: bool,
    families: int,
    per_family: int,
    max_tokens: int,
    slots: int,
    threads: int,
    grouped: bool = False,
    ram_bytes: int = -1,
) -> Side:
    path = workdir / "batch.jsonl"
    write_file(path, prompts(families, per_family, grouped=grouped), max_tokens)
    settings = {
        "GPUQ_WORKER_THREADS": str(threads),
        "GPUQ_WORKER_SLOTS": str(slots),
        "GPUQ_BATCH_PLAN": "true" if planned else "false",
        "GPUQ_WORKER_PREFIX_CACHE_RAM_BYTES": str(ram_bytes),
    }
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        with processes.client(url) as client:
            # Loads the model (a prompt that shares nothing with the batch's), so the clock
            # measures the batch, and the worker's slots are known to the planner.
            warm = {"kind": "generate", "model": BUNDLED_MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
            client.wait(client.submit(warm)["id"])
            file_id = client.upload(str(path))["id"]
            started = utcnow()
            batch_id = client.create_batch(file_id, endpoint="/v1/completions")["id"]
            finished = _wait_finished(sessions, batch_id)
        with sessions() as session:
            row = session.execute(
                select(
                    func.count(),
                    func.sum(Job.prompt_tokens),
                    func.sum(Job.cached_tokens),
                    func.sum(Job.cached_ram_tokens),
                ).where(Job.batch_id == batch_id, Job.status == "succeeded")
            ).one()
            batch = session.get(Batch, batch_id)
            groups = batch.planned_groups if batch is not None else None
    finally:
        processes.stop_all()
        engine.dispose()
    jobs, prompt, cached, ram = (int(v or 0) for v in row)
    assert jobs == families * per_family, f"{jobs} of {families * per_family} lines succeeded"
    return Side(jobs, prompt, cached, ram, (finished - started).total_seconds(), groups)


def _wait_finished(sessions: sessionmaker[Session], batch_id: str) -> datetime:
    """When the batch's last job finished, polled rarely (the poller must not steal the CPU)."""
    pending = select(func.count()).select_from(Job).where(Job.batch_id == batch_id, Job.finished_at.is_(None))
    last = select(func.max(Job.finished_at)).where(Job.batch_id == batch_id)
    while True:
        with sessions() as session:
            if session.scalar(pending) == 0:
                finished: datetime = session.scalar(last)
                return finished
        time.sleep(1.0)
