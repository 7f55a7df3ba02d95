"""``gpuq db prune``: delete the history older than a retention age, keep the stats.

The order is what keeps it safe to run beside a live system, and to interrupt:

1. the stats rollups are brought up to date first, and nothing is deleted from a day they do
   not cover yet (rows newer than the day the rollups end stay, whatever the age asked), so
   ``/v1/stats`` keeps every count and sum of the pruned history;
2. finished batches go one by one, their jobs in chunks and the batch row last, so an
   interrupted prune leaves a finished batch with fewer jobs, which the next prune finishes;
3. then finished jobs outside batches, files no batch or schedule refers to (rows first,
   then the bytes on disk), settled webhook deliveries, GPU samples, schedule runs and
   worker events.

Every step is a short transaction of at most ``chunk_rows`` rows (``gpuq.store.retention``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from gpuq.db.tables import utcnow
from gpuq.stats import rollups
from gpuq.store import retention as store

log = logging.getLogger(__name__)

CHUNK_ROWS = 5_000
_AGE = re.compile(r"^(\d+)([hdw])$")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}


def parse_age(text: str) -> timedelta:
    """``90d``, ``12w``, ``36h``: a positive whole number of hours, days or weeks."""
    found = _AGE.match(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise ValueError(f"{text!r} is not an age: give a positive number with a unit, h, d or w (e.g. 90d)")
    return int(found.group(1)) * _UNITS[found.group(2)]


@dataclass
class Pruned:
    """What a prune removed (or, for a dry run, would remove), and the cutoff it used."""

    requested_before: datetime
    before: datetime  # the cutoff applied: the requested one, or where the rollups end if earlier
    dry_run: bool = False
    jobs: int = 0  # outside batches
    batches: int = 0
    batch_jobs: int = 0
    files: int = 0
    file_bytes: int = 0
    files_missing: list[str] = field(default_factory=list)  # rows deleted whose bytes were not on this machine
    webhook_deliveries: int = 0
    gpu_samples: int = 0
    schedule_runs: int = 0
    worker_events: int = 0

    @property
    def held_back_by_rollups(self) -> bool:
        return self.before < self.requested_before


def prune(
    session: Session,
    *,
    older_than: timedelta,
    dry_run: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    now: datetime | None = None,
) -> Pruned:
    now = now or utcnow()
    requested = now - older_than
    if dry_run:  # changes nothing: where the rollups will end once the real prune has refreshed them
        rolled: datetime | None = rollups.day_start(now - rollups.ROLLUP_GRACE)
    else:
        days = rollups.refresh(session, now=now)
        if days:
            log.info("rolled up %d day(s) of stats before pruning", days)
        rolled = rollups.rolled_until(session)
    # Nothing from a day the rollups do not hold yet: its rows are the only record of its stats.
    # With no rollup at all there is no finished job or sample either, so nothing to keep.
    before = requested if rolled is None else min(requested, rolled)
    report = Pruned(requested_before=requested, before=before, dry_run=dry_run)
    if dry_run:
        _count(session, report)
    else:
        _delete(session, report, chunk_rows)
    return report


def _count(session: Session, report: Pruned) -> None:
    before = report.before
    report.batches, report.batch_jobs = store.count_finished_batches(session, before=before)
    report.jobs = store.count_finished_jobs(session, before=before)
    report.files, report.file_bytes = store.count_unreferenced_files(session, before=before)
    report.webhook_deliveries = store.count_settled_deliveries(session, before=before)
    report.gpu_samples = store.count_gpu_samples(session, before=before)
    report.schedule_runs = store.count_schedule_runs(session, before=before)
    report.worker_events = store.count_worker_events(session, before=before)
    session.commit()


def _delete(session: Session, report: Pruned, chunk_rows: int) -> None:
    before, after = report.before, ""
    # By id, each batch once: one that could not go (it changed meanwhile) is not tried again.
    while batch_ids := store.finished_batches(session, before=before, after=after, limit=chunk_rows):
        session.commit()
        for batch_id in batch_ids:
            report.batch_jobs += _delete_batch_jobs(session, batch_id, chunk_rows)
            report.batches += store.delete_finished_batch(session, batch_id, before=before)
        after = batch_ids[-1]
    report.jobs = _until_done(lambda: store.delete_finished_jobs(session, before=before, limit=chunk_rows))
    while removed := store.delete_unreferenced_files(session, before=before, limit=chunk_rows):
        report.files += len(removed)
        report.file_bytes += sum(size for _path, size in removed)
        for path, _size in removed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                report.files_missing.append(path)
    report.webhook_deliveries = _until_done(
        lambda: store.delete_settled_deliveries(session, before=before, limit=chunk_rows)
    )
    report.gpu_samples = _until_done(lambda: store.delete_gpu_samples(session, before=before, limit=chunk_rows))
    report.schedule_runs = _until_done(lambda: store.delete_schedule_runs(session, before=before, limit=chunk_rows))
    report.worker_events = _until_done(lambda: store.delete_worker_events(session, before=before, limit=chunk_rows))


def _delete_batch_jobs(session: Session, batch_id: str, chunk_rows: int) -> int:
    return _until_done(lambda: store.delete_batch_jobs(session, batch_id, limit=chunk_rows))


def _until_done(delete_chunk: Callable[[], int]) -> int:
    total = 0
    while deleted := delete_chunk():
        total += deleted
    return total
