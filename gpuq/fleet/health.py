"""Why a GPU takes no work, or not a given model: marked unhealthy (SQL, until an admin
clears it), or found too small for a model (Redis, for a while).

* **Unhealthy**: set by a worker (three jobs in a row failed with CUDA errors; llama.cpp
  cannot use the GPU it is pinned to) or its supervisor (NVML lost the GPU; its worker
  exited abnormally three times in a row, as a CUDA fault aborting the process does).
  Its workers serve nothing until ``POST /v1/gpus/{uuid}/clear``.
* **Too small for a model**: a load that ran out of memory with nothing else on the GPU
  (the estimate was short). The mark expires after ``GPUQ_GPU_TOO_SMALL_TTL_S`` so a wrong
  verdict does not keep the model off the GPU for ever, and clearing the GPU ends it at
  once. An out of memory caused by others' memory (other processes, sibling workers, a
  group sharing the GPU) is not this: the worker only steps back from the model for a
  short while on its own (``worker/faults.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.tables import EventKind
from gpuq.redis_keys import too_small_key


def mark_unhealthy(sessions: sessionmaker[Session], gpu_uuids: Sequence[str], reason: str) -> None:
    """The mark, and an event per GPU saying why (``GET /v1/events``)."""
    with sessions() as session:
        for uuid in gpu_uuids:
            store.set_gpu_health(session, uuid, healthy=False, reason=reason[:2000])
        store.record_gpu_events(session, EventKind.GPU_UNHEALTHY, gpu_uuids, reason)


def mark_too_small(redis: Redis, gpu_uuids: Sequence[str], model: str, *, ttl_s: float) -> None:
    """``model`` does not fit these GPUs, for ``ttl_s``: a sorted set per GPU, the model
    scored by when the mark ends (so marks of several models expire each on its own)."""
    until = time.time() + ttl_s
    with redis.pipeline(transaction=False) as pipe:
        for uuid in gpu_uuids:
            pipe.zadd(too_small_key(uuid), {model: until})
            pipe.expire(too_small_key(uuid), int(ttl_s) + 1)
        pipe.execute()


def too_small_models(redis: Redis, gpu_uuids: Sequence[str]) -> set[str]:
    """Models marked too small for one of these GPUs, and not expired."""
    if not gpu_uuids:
        return set()
    now = time.time()
    with redis.pipeline(transaction=False) as pipe:
        for uuid in gpu_uuids:
            pipe.zrangebyscore(too_small_key(uuid), now, "+inf")
        replies = cast(list[list[bytes]], pipe.execute())  # bytes: no client sets decode_responses
    return {model.decode() for reply in replies for model in reply}


def clear(session: Session, redis: Redis, uuid: str) -> bool:
    """An admin looked at the GPU: healthy again, and no model marked too small for it.
    False when the GPU is not in the inventory."""
    if not store.set_gpu_health(session, uuid, healthy=True, reason=None):
        return False
    redis.delete(too_small_key(uuid))
    store.record_gpu_events(session, EventKind.GPU_CLEARED, [uuid], "cleared by an admin")
    return True
