"""Writes job outcomes to SQL off the job loop, as a group commit.

A worker finishing many short jobs would otherwise spend most of its time committing one
row at a time. The writer takes whatever outcomes are waiting, writes them in one
transaction, and repeats: an outcome is never held back on purpose, yet under a flood
of short jobs each commit carries many rows.

A commit that fails (the database is down) is retried until it succeeds, and its outcomes
are copied to the worker's spool in Redis at the first failure (``gpuq.jobs.outcome_spool``),
so they outlive this process: if it dies before the database is back, the reconciler
writes them instead of running the jobs again. With Redis down too, they go to a file in
the data directory instead, found by the next worker started there or by the reconciler
of a scheduler sharing the directory (``gpuq up``). If it dies before an outcome reached either
(it crashed mid-job), the row stays ``running`` on a dead worker and the reconciler runs
the job again: at-least-once, never lost.

After each commit the writer counts the jobs it wrote for the Prometheus counters
(``gpuq/metrics.py``): only rows the commit changed count, so a late outcome from a
worker presumed dead is not counted twice. The counts go to Redis at most every
``METRICS_SEND_INTERVAL_S`` (and on ``flush``/``stop``): /metrics lags by that at most.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.jobs import outcome_spool
from gpuq.stats import metrics
from gpuq.stats.metrics import FinishedJob
from gpuq.streams.events import End
from gpuq.streams.publish import StreamPublisher

log = logging.getLogger(__name__)

MAX_BATCH = 500
RETRY_DELAY_S = 1.0
METRICS_SEND_INTERVAL_S = 0.5

Pending = tuple[store.Outcome, FinishedJob | None, End | None]


class OutcomeWriter:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        redis: Redis | None = None,
        worker: str = "",
        streams: StreamPublisher | None = None,
        spool_dir: Path | None = None,
    ) -> None:
        self._sessions = sessions
        self._redis = redis  # where the metrics and the spool go; None: not counted, not spooled
        self._worker = worker
        self._spool_dir = spool_dir  # where outcomes go when Redis cannot take them either
        self._streams = streams  # where the ends of interactive calls' jobs go, after the commit
        self._pending: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="outcome-writer", daemon=True)
        self._progress = threading.Condition()
        self._submitted = 0
        self._written = 0
        self._counts = metrics.FinishedJobCounts()
        self._counts_sent_at = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def submit(self, outcome: store.Outcome, finished: FinishedJob | None = None, end: End | None = None) -> None:
        """``end``: published to the job's token stream once the outcome is committed, so a
        caller that reads it finds the row final."""
        with self._progress:
            self._submitted += 1
        self._pending.put((outcome, finished, end))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is written, and counted in the metrics."""
        with self._progress:
            target = self._submitted
            done = self._progress.wait_for(lambda: self._written >= target, timeout_s)
        self._send_counts()
        return done

    def stop(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=60)
        self._send_counts()

    def _send_counts(self) -> None:
        self._counts_sent_at = time.monotonic()
        if self._redis is not None:
            self._counts.send(self._redis)

    def _next(self) -> Pending | None:
        """The next outcome; while counts wait to be sent, waiting no longer than their interval."""
        while True:
            if not self._counts:
                return self._pending.get()
            wait_s = self._counts_sent_at + METRICS_SEND_INTERVAL_S - time.monotonic()
            try:
                return self._pending.get(timeout=max(wait_s, 0.0)) if wait_s > 0 else self._pending.get_nowait()
            except queue.Empty:
                self._send_counts()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._next()
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
        failures = 0
        spooled = False
        spool_file: Path | None = None
        while True:
            try:
                with self._sessions() as session:
                    written = store.record_outcomes_written(session, [outcome for outcome, _, _ in batch])
                break
            except SQLAlchemyError:
                if failures == 0:
                    log.exception("writing %d job outcomes failed; retrying until the database answers", len(batch))
                    spooled = self._spool(batch)
                    spool_file = None if spooled else self._spool_to_file(batch)
                failures += 1
                time.sleep(RETRY_DELAY_S)
        if failures:
            log.warning("wrote %d job outcomes after %d failed attempts", len(batch), failures)
        if spooled:
            self._unspool(batch)
        if spool_file is not None:
            outcome_spool.unspool_file(spool_file)
        if self._streams is not None:
            self._streams.ends([(o.job_id, end) for o, _, end in batch if end is not None and o.job_id in written])
        self._counts.add(f for outcome, f, _ in batch if f is not None and outcome.job_id in written)
        if time.monotonic() - self._counts_sent_at >= METRICS_SEND_INTERVAL_S:
            self._send_counts()

    def _spool(self, batch: list[Pending]) -> bool:
        if self._redis is None or not self._worker:
            return False
        try:
            outcome_spool.spool(self._redis, self._worker, [(outcome, finished) for outcome, finished, _ in batch])
        except RedisError:
            log.warning("could not spool %d outcomes to Redis either", len(batch), exc_info=True)
            return False
        return True

    def _spool_to_file(self, batch: list[Pending]) -> Path | None:
        if self._spool_dir is None:
            return None
        try:
            path = outcome_spool.spool_to_file(self._spool_dir, [(outcome, finished) for outcome, finished, _ in batch])
        except OSError:
            log.warning("could not spool %d outcomes to a file either; they wait in memory", len(batch), exc_info=True)
            return None
        log.warning("%d outcomes spooled to %s until the database answers", len(batch), path)
        return path

    def _unspool(self, batch: list[Pending]) -> None:
        assert self._redis is not None
        try:
            outcome_spool.unspool(self._redis, self._worker, [outcome.job_id for outcome, _, _ in batch])
        except RedisError:  # the reconciler drops the spool of this worker once it is gone
            log.warning("could not clear %d spooled outcomes", len(batch), exc_info=True)
