"""How far running jobs have got, read from their token streams: what a jobs list shows
beside a running job's elapsed time.

A stream holds the attempt's start, then text deltas (a job's text of about 50 ms each,
``gpuq.streams.publish``), each with the number of tokens it covers. Their sum is the
completion tokens so far; reading it costs a stream's entries, some 20 a second of decoding,
so it is read only for running jobs that stream (those of interactive calls), one pipeline
for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis import Redis

from gpuq.redis_keys import job_stream_key
from gpuq.streams.events import FIELD, Delta, decode

Entries = list[tuple[bytes, dict[bytes, bytes]]]  # XRANGE's reply (no client sets decode_responses)


def tokens_streamed(redis: Redis, job_ids: Sequence[str]) -> dict[str, int]:
    """Completion tokens each job's stream holds now, by job; a job without a stream (it was
    not asked for one, or its attempt has not started) is absent."""
    if not job_ids:
        return {}
    with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.xrange(job_stream_key(job_id))
        replies = cast(list[Entries], pipe.execute())
    counts = {}
    for job_id, entries in zip(job_ids, replies, strict=True):
        if entries:
            events = (decode(fields[FIELD]) for _id, fields in entries)
            counts[job_id] = sum(e.tokens for e in events if isinstance(e, Delta))
    return counts
