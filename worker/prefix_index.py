"""The worker's entry in the fleet's prefix index: which prompt starts its caches hold.

The API places a generation job on the worker whose cache holds the job's start
(``gpuq.jobs.prefix_routing``). For that, each worker keeps a Redis set of the block hashes
(``gpuq.prefix_blocks``) that its KV slots and its prefix cache's RAM tier hold now
(``gpuq.redis_keys.prefix_index_key``): each slot's reusable tokens hashed under their scope
(the model file and tenant, as the cache keys them), and each RAM entry's chain as the tier
keeps it. Starts on disk are left out: restoring one costs more than a slot or RAM hit, and a
disk tier outlives the worker that would publish it.

Sent with every heartbeat (the idle loop's, at most once a second, and the running job
monitor's, every ``GPUQ_WORKER_HEARTBEAT_INTERVAL_S``) as a diff of what it last sent, so a
heartbeat costs two set commands of the blocks gained and lost; the whole set is written again
every ``FULL_EVERY_S`` (Redis may have lost it). The key's TTL is the worker's, so a dead
worker's index expires with its registration; the reconciler drops it sooner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from redis.client import Pipeline

from gpuq.jobs.prefix_routing import MAX_BLOCKS
from gpuq.prefix_blocks import BLOCK_TOKENS, block_hashes
from gpuq.redis_keys import prefix_index_key
from worker.engine import LoadedModel
from worker.prefix_cache import PrefixCache

FULL_EVERY_S = 30.0


def held_hashes(cache: PrefixCache | None, models: Iterable[LoadedModel]) -> set[bytes]:
    """The block hashes of the starts the slots of ``models`` and the RAM tier hold now (each
    chain's first ``MAX_BLOCKS``, as the API keeps a job's)."""
    held: set[bytes] = set()
    if cache is not None:
        for chain in cache.ram.chains():
            held.update(chain[:MAX_BLOCKS])
    for model in models:
        if model.decoder is None:
            continue
        for tokens, scope in model.decoder.kv.snapshot():
            if len(tokens) >= BLOCK_TOKENS and scope:
                held.update(block_hashes(tokens[: MAX_BLOCKS * BLOCK_TOKENS], scope))
    return held


class IndexPublisher:
    def __init__(self, worker_name: str, held: Callable[[], set[bytes]], *, ttl_s: int) -> None:
        self._key = prefix_index_key(worker_name)
        self._held = held
        self._ttl_s = ttl_s
        self._sent: set[bytes] | None = None
        self._full_at = 0.0
        self._lock = threading.Lock()  # the idle loop and the running job's monitor both heartbeat

    def send(self, pipe: Pipeline) -> None:
        """The blocks gained and lost since the last send (or all of them), into the caller's
        pipeline, with the key's TTL renewed."""
        with self._lock:
            self._send(pipe)

    def _send(self, pipe: Pipeline) -> None:
        now = set(self._held())
        if self._sent is None or time.monotonic() - self._full_at >= FULL_EVERY_S:
            pipe.delete(self._key)
            if now:
                pipe.sadd(self._key, *now)
            self._full_at = time.monotonic()
        else:
            if gained := now - self._sent:
                pipe.sadd(self._key, *gained)
            if lost := self._sent - now:
                pipe.srem(self._key, *lost)
        pipe.expire(self._key, self._ttl_s)
        self._sent = now

    def forget(self) -> None:
        """The next send writes the whole set (a send that may not have reached Redis)."""
        self._sent = None

    @property
    def key(self) -> str:
        return self._key
