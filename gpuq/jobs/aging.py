"""Priority aging: no job starves under a steady stream of higher-priority work.

Workers always take the highest non-empty priority first. A job that has waited
``aging_s`` in its queue moves to the front of the queue one priority up, so a ``low``
job reaches the front of ``high`` after at most ``2 * aging_s`` (plus one scheduler tick
per step), and then runs next. The job's SQL row keeps the priority it was submitted
with; only its place in Redis changes.

The move is one Lua script (remove from the old queue, push to the new one, update RQ's
``origin``), so a job a worker pops meanwhile is never duplicated or lost.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from redis import Redis
from rq.utils import utcformat, utcparse

from gpuq.db.tables import utcnow
from gpuq.queue_names import Priority, parse_queue_name, queue_name
from gpuq.redis_keys import RQ_QUEUE_PREFIX, RQ_QUEUES, rq_job_key, rq_queue_key

SCAN_DEPTH = 100  # oldest entries looked at per queue and tick

_MOVE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[4], KEYS[2])
  redis.call('HSET', KEYS[3], 'origin', ARGV[2], 'enqueued_at', ARGV[3])
  return 1
end
return 0
"""


def gpuq_queues(redis: Redis) -> list[tuple[str, str, str, Priority]]:
    """(queue name, model, kind, priority) of every gpuq queue RQ knows."""
    found = []
    # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
    for key in cast(set[bytes], redis.smembers(RQ_QUEUES)):
        name = key.decode().removeprefix(RQ_QUEUE_PREFIX)
        try:
            model, kind, priority = parse_queue_name(name)
        except ValueError:
            continue  # another application's queue
        found.append((name, model, kind, priority))
    return found


def promote_aged_jobs(redis: Redis, *, aging_s: float, now: datetime | None = None) -> list[str]:
    """Move every job that waited ``aging_s`` up one priority; returns the ids moved."""
    if aging_s <= 0:
        return []
    now = now or utcnow()
    cutoff = now - timedelta(seconds=aging_s)
    move = redis.register_script(_MOVE)
    moved = []
    for name, model, kind, priority in gpuq_queues(redis):
        if priority == Priority.HIGH:
            continue
        target = queue_name(model, kind, Priority(priority - 1))
        ids = [i.decode() for i in cast(list[bytes], redis.lrange(rq_queue_key(name), 0, SCAN_DEPTH - 1))]
        with redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(rq_job_key(job_id), "enqueued_at")
            stamps = pipe.execute()
        aged = [
            job_id for job_id, stamp in zip(ids, stamps, strict=True) if stamp and utcparse(stamp.decode()) <= cutoff
        ]
        # Youngest first, each pushed to the front: the oldest ends up first in line.
        for job_id in reversed(aged):
            keys = [
                rq_queue_key(name),
                rq_queue_key(target),
                rq_job_key(job_id),
                RQ_QUEUES,
            ]
            if move(keys=keys, args=[job_id, target, utcformat(now)]):
                moved.append(job_id)
    return moved
