"""Writes job outcomes to SQL off the job loop, as a group commit.

A worker finishing many short jobs would otherwise spend most of its time committing one
row at a time. The writer takes whatever outcomes are waiting, writes them in one
transaction, and repeats: an outcome is never held back on purpose, yet under a flood
of short jobs each commit carries many rows. If the process dies before a write, those
rows stay ``running`` on a dead worker and the reconciler runs them again:
at-least-once, never lost.

After each commit the writer adds the jobs it wrote to the Prometheus counters in Redis
(``gpuq/metrics.py``), in one pipeline per group: only rows the commit changed count, so a
late outcome from a worker presumed dead is not counted twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from redis import Redis
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gpuq import metrics, store
from gpuq.metrics import FinishedJob

log = logging.getLogger(__name__)

MAX_BATCH = 500
RETRY_DELAY_S = 1.0

Pending = tuple[store.Outcome, FinishedJob | None]


class OutcomeWriter:
    def __init__(self, sessions: sessionmaker[Session], *, redis: Redis | None = None) -> None:
        self._sessions = sessions
        self._redis = redis  # where the metrics go; None: not counted
        self._pending: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="outcome-writer", daemon=True)
        self._progress = threading.Condition()
        self._submitted = 0
        self._written = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, outcome: store.Outcome, finished: FinishedJob | None = None) -> None:
        with self._progress:
            self._submitted += 1
        self._pending.put((outcome, finished))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is written."""
        with self._progress:
            target = self._submitted
            return self._progress.wait_for(lambda: self._written >= target, timeout_s)

    def stop(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._pending.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._write(batch)
            with self._progress:
                self._written += len(batch)
                self._progress.notify_all()

    def _write(self, batch: list[Pending]) -> None:
        while True:
            try:
                with self._sessions() as session:
                    written = store.record_outcomes_written(session, [outcome for outcome, _ in batch])
                break
            except SQLAlchemyError:
                log.exception("writing %d job outcomes failed; retrying", len(batch))
                time.sleep(RETRY_DELAY_S)
        if self._redis is not None:
            finished = (f for outcome, f in batch if f is not None and outcome.job_id in written)
            metrics.record_finished_jobs(self._redis, finished)
