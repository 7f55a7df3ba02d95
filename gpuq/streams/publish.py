"""The worker's side of token streams: writing a job's events into its Redis stream.

A job's first text goes out at once (it is the time to first token). After that, text is
sent at most every ``FLUSH_INTERVAL_S``, each job's pieces since the last send joined into
one delta, and always at once when a sequence ends: one pipeline carries every streaming
sequence's text, so K sequences cost one round trip, not K, and a reader wakes a few times
a second, not once a token. On a host whose cores all run llama.cpp, every wake-up of the
API, its client or Redis takes time from decoding (docs/benchmarks.md, streaming); 50 ms
of text at a time reads as smoothly. Publishing is best effort: a job's
outcome lives in SQL whatever happens here, and a follower that hears nothing for a while
reads the row (see ``gpuq.streams.follow``), so a Redis error is logged, never raised into
the decoding loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from redis import Redis
from redis.exceptions import RedisError

from gpuq.redis_keys import STREAM_DONE_TTL_S, STREAM_TTL_S, job_stream_key
from gpuq.streams.events import FIELD, Delta, End, Start, encode

log = logging.getLogger(__name__)

# Events beyond a job's tokens: its start and its end. Each delta covers a token or more, so
# a stream holds at most max_tokens + this; the bound below only guards against a bug.
_EVENTS_BESIDE_TOKENS = 2
FLUSH_INTERVAL_S = 0.05


class StreamPublisher:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._bounds: dict[str, int] = {}  # job id -> most events its stream may hold
        self._held: dict[tuple[str, int], Delta] = {}  # text not sent yet, per job and sample
        self._spoke: set[str] = set()  # jobs whose first text is out
        self._sent_at = float("-inf")

    def start(self, job_id: str, event: Start, *, max_tokens: int) -> None:
        """A new attempt: the stream starts afresh, so it never mixes two attempts' text.
        ``max_tokens``: of all its samples together."""
        bound = max_tokens + _EVENTS_BESIDE_TOKENS
        self._bounds[job_id] = bound
        self._spoke.discard(job_id)  # a new attempt's first text goes out at once too
        self._drop_held(job_id)
        key = job_stream_key(job_id)
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(key)
                pipe.xadd(key, {FIELD: encode(event)}, maxlen=bound, approximate=False)
                pipe.expire(key, STREAM_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish the start of job %s", job_id, exc_info=True)

    def deltas(self, deltas: Sequence[tuple[str, Delta]], *, now: bool = False) -> None:
        """Text of several jobs, in order per job: sent at once if ``now`` (a sequence ended) or
        a job's first text is among it, else when ``FLUSH_INTERVAL_S`` has passed since the last send."""
        for job_id, delta in deltas:
            before = self._held.get((job_id, delta.index))
            self._held[job_id, delta.index] = before.then(delta) if before else delta
            now = now or job_id not in self._spoke
        if not self._held or not (now or time.monotonic() - self._sent_at >= FLUSH_INTERVAL_S):
            return
        held, self._held = self._held, {}
        self._spoke |= {job_id for job_id, _ in held}
        self._sent_at = time.monotonic()
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for (job_id, _), delta in held.items():
                    key = job_stream_key(job_id)
                    pipe.xadd(key, {FIELD: encode(delta)}, maxlen=self._bounds.get(job_id), approximate=False)
                    pipe.expire(key, STREAM_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish the text of %d jobs", len(held), exc_info=True)

    def forget(self, job_id: str) -> None:
        """A job that leaves this worker without an end (handed back to its queue)."""
        self._bounds.pop(job_id, None)
        self._drop_held(job_id)
        self._spoke.discard(job_id)

    def _drop_held(self, job_id: str) -> None:
        for key in [k for k in self._held if k[0] == job_id]:
            del self._held[key]

    def ends(self, ends: Sequence[tuple[str, End]]) -> None:
        """Jobs whose outcome is now in SQL (the outcome writer calls this after its commit)."""
        if not ends:
            return
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for job_id, end in ends:
                    key = job_stream_key(job_id)
                    pipe.xadd(key, {FIELD: encode(end)})
                    pipe.expire(key, STREAM_DONE_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish the end of %d jobs", len(ends), exc_info=True)
        for job_id, _ in ends:
            self._bounds.pop(job_id, None)
            self._spoke.discard(job_id)
