"""The API's side of token streams: following a job's events until its end.

The follower blocks on the job's Redis stream (``XREAD BLOCK`` on an asyncio Redis client,
so a waiting call costs one idle connection and no CPU) and reads from the stream's first
entry, so it misses nothing however late it starts. SQL stays the truth: when the stream
has been silent for ``check_interval_s`` (the job waits in its queue, or it ended in a way
no worker reported: cancelled while queued, failed by the reconciler, or Redis was down),
the follower reads the job's row once, and a final row ends the follow with the row's
figures. That read is the only SQL the wait costs, one per interval of silence.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import cast

import anyio
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuq import store
from gpuq.db.tables import Job, JobStatus
from gpuq.redis_keys import job_stream_key
from gpuq.streams.events import FIELD, End, Event, decode, end_of_job

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 5.0
READ_COUNT = 512  # entries per XREAD at most

# XREAD's reply for one stream (no client sets decode_responses): [(key, [(entry id, fields)])]
Reply = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]


async def _xread(streams: AsyncRedis, key: str, last: bytes, block_ms: int | None = None) -> Reply:
    return cast(Reply, await streams.xread({key: last}, block=block_ms, count=READ_COUNT) or [])


def end_of(job: Job) -> End:
    """The end a worker would have published, from the job's final row."""
    return end_of_job(
        job.status,
        job.result,
        error=job.error,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=job.completion_tokens,
        cached_tokens=job.cached_tokens,
        load_ms=job.load_ms,
        run_ms=job.run_ms,
    )


async def follow_job(
    streams: AsyncRedis,
    sessions: async_sessionmaker[AsyncSession],
    job_id: str,
    *,
    check_interval_s: float = CHECK_INTERVAL_S,
) -> AsyncIterator[Event]:
    """The job's events in order, ending with its :class:`End`."""
    key = job_stream_key(job_id)
    last = b"0-0"
    while True:
        try:
            reply = await _xread(streams, key, last, int(check_interval_s * 1000))
        except RedisError:
            log.warning("cannot read the stream of job %s; reading its row instead", job_id, exc_info=True)
            reply = []
            await anyio.sleep(check_interval_s)
        if reply:
            for entry_id, fields in reply[0][1]:
                last = entry_id
                event = decode(fields[FIELD])
                yield event
                if isinstance(event, End):
                    return
            continue
        job = await _read_job(sessions, job_id)
        if job is None or JobStatus(job.status).is_final:
            async for event in _drain(streams, key, last):  # what came between the silence and the read
                yield event
                if isinstance(event, End):
                    return
            if job is None:  # deleted (its batch was, say): nothing more will come
                yield End(status=JobStatus.FAILED.value, error=f"job {job_id} no longer exists")
            else:
                yield end_of(job)
            return


async def _drain(streams: AsyncRedis, key: str, last: bytes) -> AsyncIterator[Event]:
    try:
        reply = await _xread(streams, key, last)
    except RedisError:
        return
    for _entry_id, fields in reply[0][1] if reply else ():
        yield decode(fields[FIELD])


async def _read_job(sessions: async_sessionmaker[AsyncSession], job_id: str) -> Job | None:
    async with sessions() as session:
        return await session.run_sync(store.get_job, job_id)
