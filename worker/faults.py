"""Recognising GPU faults in llama.cpp's errors, and counting them per GPU.

* Out of memory while loading: the runner evicts everything and retries once, then hands
  the job back for another GPU and marks this GPU as too small for that model.
* Repeated CUDA errors: after ``threshold`` jobs in a row fail with one, the worker's GPU
  is marked unhealthy in SQL and the worker stops taking jobs until an admin clears it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.jobs.enqueue import QueueEntry, enqueue_jobs
from gpuq.redis_keys import too_small_key

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


def too_small_models(redis: Redis, gpu_uuids: tuple[str, ...]) -> set[str]:
    """Models learned not to fit (one of) these GPUs; the worker stops serving them."""
    if not gpu_uuids:
        return set()
    # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
    return {m.decode() for m in cast(set[bytes], redis.sunion([too_small_key(u) for u in gpu_uuids]))}


def hand_back_to_queue(
    sessions: sessionmaker[Session], redis: Redis, *, worker: str, gpu_uuids: tuple[str, ...], timeout_s: int
) -> Callable[[store.ClaimedJob, str], None]:
    """The runner's hand-back: the job returns to its queue (SQL first, then Redis) and this
    GPU is marked too small for the model, so the next worker to take it is another one."""

    def hand_back(job: store.ClaimedJob, reason: str) -> None:
        with redis.pipeline(transaction=False) as pipe:
            for uuid in gpu_uuids:
                pipe.sadd(too_small_key(uuid), job.model)
            pipe.execute()
        with sessions() as session:
            if not store.return_to_queue(session, job.id, worker=worker):
                return
        enqueue_jobs(redis, [QueueEntry.of(job)], timeout_s=timeout_s)
        log.warning(
            "job %s handed back (%s); %s marked too small for %s", job.id, reason, ",".join(gpu_uuids), job.model
        )

    return hand_back
