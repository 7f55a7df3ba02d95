"""Preemption by priority (issue 41 item 4): K slots decoding long low-priority answers, then
one short high-priority job, on one worker.

Three sides, same jobs, same worker, one after the other on fresh state, one per
``GPUQ_WORKER_PREEMPTION``: ``off`` (priority orders the queue only, so the high job waits for
a slot), ``park`` (the high job parks the least urgent, newest sequence and runs at once beside
the others, ``worker/decoding/parking.py``) and ``strict`` (that, and the others wait while it
decodes: the CPU's default). Each side measures, with the model loaded:

* the high job alone on the idle worker (submission to finish, from the jobs table);
* the K low jobs alone, start to last finish;
* the K low jobs again, and the high job submitted once they all decode: its latency, and the
  low jobs' start to last finish.

Targets: the high job's latency beside the low ones at most 1.5x its idle latency, and the
low jobs' time within 1.1x of their time alone plus the high job's own run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.registry.bundled import BUNDLED_MODEL_NAME
from gpuq.testing import GpuqProcesses

URGENT_TOKENS = 8
# Openings the bundled model goes on from for hundreds of tokens, greedy (it ends a question at once).
OPENINGS = [
    "Once upon a time, in a small village by the sea,",
    "The history of the lighthouse begins",
    "In the year 1850, a young engineer named",
    "The recipe for a good sourdough bread starts with",
    "Chapter one. The train left the station at dawn and",
    "Dear diary, today was the strangest day of my life because",
    "The committee met on Tuesday to discuss the new bridge, and",
    "Long before the city was built, the valley was home to",
]
DECODING_S = 1.0  # the low jobs decode this long before the high one comes


@dataclass(frozen=True)
class Side:
    idle_s: float  # the high job alone: submission to finish
    busy_s: float  # ... beside K decoding low jobs
    lows_alone_s: float  # the K low jobs alone, first submission to last finish
    lows_busy_s: float  # ... with the high job among them
    urgent_run_s: float  # the high job's own run, alone
    parked_ms: int  # the longest parked_ms of the low jobs beside the high one


def _low(i: int, max_tokens: int) -> dict[str, object]:
    return {
        "kind": "generate",
        "model": BUNDLED_MODEL_NAME,
        "prompt": OPENINGS[i % len(OPENINGS)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "priority": "low",
    }


URGENT = {
    "kind": "generate",
    "model": BUNDLED_MODEL_NAME,
    "prompt": "The capital of France is",
    "max_tokens": URGENT_TOKENS,
    "temperature": 0,
    "priority": "high",
}


class _Jobs:
    def __init__(self, database_url: str) -> None:
        self._engine = sync_engine(database_url)
        self._sessions = sync_sessions(self._engine)

    def rows(self, ids: list[str]) -> list:
        with self._sessions() as session:
            return list(session.execute(select(Job).where(Job.id.in_(ids))).scalars())

    def wait(self, ids: list[str], *, status: str | None = None) -> list:
        """Polled rarely: the poller must not take the cores from llama.cpp's threads."""
        while True:
            rows = self.rows(ids)
            if status is not None and all(r.status == status for r in rows):
                return rows
            if status is None and all(r.finished_at is not None for r in rows):
                assert all(r.status == "succeeded" for r in rows), [(r.status, r.error) for r in rows]
                return rows
            time.sleep(0.2)

    def close(self) -> None:
        self._engine.dispose()


def _span(rows: list) -> float:
    start: datetime = min(r.created_at for r in rows)
    return (max(r.finished_at for r in rows) - start).total_seconds()


MODES = ("off", "park", "strict")


def run(database_url: str, redis_url: str, workdir: Path, *, mode: str, slots: int, max_tokens: int) -> Side:
    settings = {"GPUQ_WORKER_SLOTS": str(slots), "GPUQ_WORKER_PREEMPTION": mode}
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    jobs = _Jobs(database_url)
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        with GpuqClient(url, api_key=processes.admin_key) as client:
            client.wait(client.submit(URGENT | {"max_tokens": 1})["id"])  # the model loaded first
            [idle] = jobs.wait([client.submit(URGENT)["id"]])
            lows = jobs.wait([j["id"] for j in client.submit_many([_low(i, max_tokens) for i in range(slots)])])
            busy_ids = [j["id"] for j in client.submit_many([_low(i, max_tokens) for i in range(slots)])]
            jobs.wait(busy_ids, status="running")
            time.sleep(DECODING_S)
            [urgent] = jobs.wait([client.submit(URGENT)["id"]])
            busy = jobs.wait(busy_ids)
    finally:
        processes.stop_all()
        jobs.close()
    return Side(
        idle_s=(idle.finished_at - idle.created_at).total_seconds(),
        busy_s=(urgent.finished_at - urgent.created_at).total_seconds(),
        lows_alone_s=_span(lows),
        lows_busy_s=_span(busy),
        urgent_run_s=(idle.run_ms or 0) / 1000,
        parked_ms=max(r.parked_ms or 0 for r in busy),
    )
