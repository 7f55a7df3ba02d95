"""Fair shares between tenants (issue 42 item 1): tenant A queues 96 short generation jobs at
normal priority, tenant B queues 4 of the same one second later, on one worker.

Two sides, same jobs, same worker settings, one after the other on fresh state:

* **fair**: A's and B's jobs under their own keys, so each tenant has its queue and the
  worker's pick shares turns between them (``gpuq/jobs/fair.py``);
* **FIFO**: the same 100 jobs under one tenant's key, so they wait in one queue, first in
  first out: what gpuq did for every tenant before fair shares.

Reported for each: after how many of A's jobs B's last job finished (target for fair: at
most 16, the ones already running or done when B arrives and about a round), and the jobs
per second from A's submission to the last finish (target: fair within 5% of FIFO).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import select

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job, utcnow
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

A_JOBS, B_JOBS = 96, 4
B_DELAY_S = 1.0


@dataclass(frozen=True)
class Side:
    a_before_b_done: int  # of A's jobs, those finished before B's last one
    jobs_per_s: float
    seconds: float


def _job(i: int, max_tokens: int) -> dict[str, object]:
    return {
        "kind": "generate",
        "model": BUNDLED_MODEL_NAME,
        "prompt": f"Count from {i} upwards:",
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def _key(url: str, admin: str, owner: str) -> str:
    made = httpx.post(
        f"{url}/v1/keys",
        json={"name": f"bench-{owner}", "owner": owner},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=30,
    )
    made.raise_for_status()
    return str(made.json()["key"])


def run(database_url: str, redis_url: str, workdir: Path, *, fair: bool, max_tokens: int, slots: int) -> Side:
    processes = GpuqProcesses(database_url, redis_url, workdir, settings={"GPUQ_WORKER_SLOTS": str(slots)})
    engine = sync_engine(database_url)
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        key_a = _key(url, processes.admin_key, "tenant-a")
        key_b = _key(url, processes.admin_key, "tenant-b") if fair else key_a
        with GpuqClient(url, api_key=key_a) as a, GpuqClient(url, api_key=key_b) as b:
            a.wait(a.submit(_job(0, 1))["id"])  # the model loaded before the clock starts
            started = utcnow()
            a_ids = [j["id"] for j in a.submit_many([_job(i, max_tokens) for i in range(A_JOBS)])]
            time.sleep(B_DELAY_S)
            b_ids = [j["id"] for j in b.submit_many([_job(1000 + i, max_tokens) for i in range(B_JOBS)])]
        ids = a_ids + b_ids
        sessions = sync_sessions(engine)
        while True:  # polled rarely: the poller must not steal CPU from llama.cpp's threads
            with sessions() as session:
                rows = session.execute(select(Job.id, Job.status, Job.finished_at).where(Job.id.in_(ids))).all()
            if all(r.finished_at is not None for r in rows):
                break
            time.sleep(0.5)
    finally:
        processes.stop_all()
        engine.dispose()
    assert all(r.status == "succeeded" for r in rows), [r.status for r in rows]
    finished = {r.id: r.finished_at for r in rows}
    b_done = max(finished[i] for i in b_ids)
    a_before = sum(1 for i in a_ids if finished[i] <= b_done)
    seconds = (max(finished.values()) - started).total_seconds()
    return Side(a_before, len(ids) / seconds, seconds)
