"""Recognising GPU faults in llama.cpp's errors, and counting them per GPU.

* Out of memory while loading: the runner evicts everything and retries once, then hands
  the job back for another GPU. Why it ran out decides what else happens. If other
  processes hold memory on the GPU (another program, a sibling worker of
  ``--slots-per-gpu``, a group worker sharing it), the shortage is temporary: this worker
  steps back from the model for ``BUSY_STEP_BACK_S`` on its own, and nothing is marked.
  If the GPU was otherwise empty, the model does not fit it: the GPU is marked too small
  for the model, for every worker, for ``GPUQ_GPU_TOO_SMALL_TTL_S`` (``gpuq/fleet/health.py``).
* Repeated CUDA errors: after ``threshold`` jobs in a row fail with one, the worker's GPU
  is marked unhealthy in SQL and the worker stops taking jobs until an admin clears it.
  (A CUDA error that aborts the process is counted by the supervisor instead.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.fleet import health
from gpuq.jobs.enqueue import QueueEntry, enqueue_jobs

log = logging.getLogger(__name__)

# What llama.cpp / llama-cpp-python say when memory runs out while loading a model or
# creating its context (the CUDA backend's messages, and the wrapper's).
OUT_OF_MEMORY_MARKERS = (
    "out of memory",
    "failed to allocate",
    "unable to allocate",
    "cudamalloc",
    "failed to create llama_context",
)
DEFAULT_CUDA_ERROR_THRESHOLD = 3
BUSY_STEP_BACK_S = 30.0
# Memory others may hold on a GPU before an out of memory is blamed on them rather than on
# the model: above what the driver and the odd monitoring tool take.
OTHERS_SLACK_MIB = 512


class HandBack(Exception):
    """This worker cannot run the job; it goes back to the queue for another GPU."""


def is_out_of_memory(exc: BaseException) -> bool:
    message = str(exc).lower()
    return any(marker in message for marker in OUT_OF_MEMORY_MARKERS)


def is_cuda_error(message: str) -> bool:
    return "cuda" in message.lower()


class GpuHealth:
    """Counts consecutive CUDA errors; calls ``mark_unhealthy`` once at the threshold."""

    def __init__(self, mark_unhealthy: Callable[[str], None], *, threshold: int = DEFAULT_CUDA_ERROR_THRESHOLD) -> None:
        self._mark_unhealthy = mark_unhealthy
        self._threshold = threshold
        self._consecutive = 0

    def record(self, error: str | None) -> None:
        if error is None or not is_cuda_error(error):
            self._consecutive = 0
            return
        self._consecutive += 1
        if self._consecutive == self._threshold:
            reason = f"{self._threshold} jobs in a row failed with CUDA errors; last: {error[:500]}"
            log.error("marking this worker's GPU unhealthy: %s", reason)
            self._mark_unhealthy(reason)


class StepBack:
    """Models this worker leaves alone for a while (its catalog skips them), in this process only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, model: str, seconds: float) -> None:
        with self._lock:
            self._until[model] = self._clock() + seconds

    def models(self) -> set[str]:
        now = self._clock()
        with self._lock:
            self._until = {m: t for m, t in self._until.items() if t > now}
            return set(self._until)


OthersHold = Callable[[], int | None]  # MiB others hold on the worker's GPUs now; None: unknown


def hand_back_to_queue(
    sessions: sessionmaker[Session],
    redis: Redis,
    *,
    worker: str,
    gpu_uuids: tuple[str, ...],
    timeout_s: int,
    too_small_ttl_s: float,
    others_hold: OthersHold = lambda: None,
    step_back: StepBack | None = None,
) -> Callable[[store.ClaimedJob, str], None]:
    """The runner's hand-back: the job returns to its queue (SQL first, then Redis), and
    either this worker steps back from the model (others hold the GPU's memory) or the GPU
    is marked too small for it (it was otherwise empty), so that another GPU takes it."""

    def hand_back(job: store.ClaimedJob, reason: str) -> None:
        held = others_hold()
        if held is not None and held > OTHERS_SLACK_MIB:
            verdict = f"the GPU is busy ({held} MiB held by others): stepping back from {job.model} for a while"
            if step_back is not None:
                step_back.add(job.model, BUSY_STEP_BACK_S)
        else:
            verdict = f"{','.join(gpu_uuids)} marked too small for {job.model} for {too_small_ttl_s:.0f} s"
            health.mark_too_small(redis, gpu_uuids, job.model, ttl_s=too_small_ttl_s)
        with sessions() as session:
            if not store.return_to_queue(session, job.id, worker=worker, reason=f"handed back: {reason}"):
                return
        enqueue_jobs(redis, [QueueEntry.of(job)], timeout_s=timeout_s)
        log.warning("job %s handed back (%s); %s", job.id, reason, verdict)

    return hand_back


def send_back_to_queue(
    sessions: sessionmaker[Session], redis: Redis, *, worker: str, timeout_s: int
) -> Callable[[store.ClaimedJob, str], None]:
    """The runner's send-back for a request the decoder had no KV room for beside the others:
    back to its queue with the attempt refunded and nothing marked (neither the job nor the GPU
    is at fault: the job runs as soon as room frees, here or elsewhere)."""

    def send_back(job: store.ClaimedJob, reason: str) -> None:
        with sessions() as session:
            if not store.return_to_queue(
                session, job.id, worker=worker, reason=f"sent back: {reason}", refund_attempt=True
            ):
                return
        enqueue_jobs(redis, [QueueEntry.of(job)], timeout_s=timeout_s)
        log.warning("job %s sent back to its queue, uncharged (%s)", job.id, reason)

    return send_back
