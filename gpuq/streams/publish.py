"""The worker's side of token streams: writing a job's events into its Redis stream.

One pipeline per decoder step carries the text of every streaming sequence that got some,
so K sequences cost one round trip a step, not K. Publishing is best effort: a job's
outcome lives in SQL whatever happens here, and a follower that hears nothing for a while
reads the row (see ``gpuq.streams.follow``), so a Redis error is logged, never raised into
the decoding loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from redis import Redis
from redis.exceptions import RedisError

from gpuq.redis_keys import STREAM_DONE_TTL_S, STREAM_TTL_S, job_stream_key
from gpuq.streams.events import FIELD, Delta, End, Start, encode

log = logging.getLogger(__name__)

# Events beyond a job's tokens: its start and its end. Each delta covers a token or more, so
# a stream holds at most max_tokens + this; the bound below only guards against a bug.
_EVENTS_BESIDE_TOKENS = 2


class StreamPublisher:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._bounds: dict[str, int] = {}  # job id -> most events its stream may hold

    def start(self, job_id: str, event: Start, *, max_tokens: int) -> None:
        """A new attempt: the stream starts afresh, so it never mixes two attempts' text."""
        bound = max_tokens + _EVENTS_BESIDE_TOKENS
        self._bounds[job_id] = bound
        key = job_stream_key(job_id)
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(key)
                pipe.xadd(key, {FIELD: encode(event)}, maxlen=bound, approximate=False)
                pipe.expire(key, STREAM_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish the start of job %s", job_id, exc_info=True)

    def deltas(self, deltas: Sequence[tuple[str, Delta]]) -> None:
        """Text of several jobs, in order per job, in one round trip."""
        if not deltas:
            return
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for job_id in dict.fromkeys(job_id for job_id, _ in deltas):
                    pipe.expire(job_stream_key(job_id), STREAM_TTL_S)
                for job_id, delta in deltas:
                    bound = self._bounds.get(job_id)
                    pipe.xadd(job_stream_key(job_id), {FIELD: encode(delta)}, maxlen=bound, approximate=False)
                pipe.execute()
        except RedisError:
            log.warning("could not publish the text of %d jobs", len({j for j, _ in deltas}), exc_info=True)

    def forget(self, job_id: str) -> None:
        """A job that leaves this worker without an end (handed back to its queue)."""
        self._bounds.pop(job_id, None)

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
