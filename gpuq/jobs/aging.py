"""Priority aging: no job starves under a steady stream of higher-priority work.

Workers always take the highest non-empty priority first. A job that has waited
``aging_s`` in its queue moves to the front of its tenant's queue one priority up, so a
``low`` job reaches the front of its tenant's ``high`` queue after at most ``2 * aging_s``
(plus one scheduler tick per step), and then runs at that tenant's next fair turn in
``high`` (``gpuq.jobs.fair``: about one round). The job's SQL row keeps the priority it was
submitted with; only its place in Redis changes.

The move is one Lua script (remove from the old queue, push to the new one, note the
tenant among the new band's flows and ring its bell, update RQ's ``origin``), so a job a
worker pops meanwhile is never duplicated or lost. It goes to the front of its part of the new
queue: a job with a deadline among that queue's deadline jobs by its deadline (and from the old
queue's deadline set to the new one's), one without in front of that queue's jobs without one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from redis import Redis
from rq.utils import utcformat, utcparse

from gpuq.db.tables import utcnow
from gpuq.jobs.fair import INSERT_AT
from gpuq.queue_names import Priority, QueueName, band_name, parse_queue
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    JOB_DEADLINE_FIELD,
    RQ_QUEUE_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_edf_key,
    fair_flows_key,
    rq_job_key,
    rq_queue_key,
)

SCAN_DEPTH = 100  # oldest entries looked at per queue and tick

# KEYS: the old queue, the new one, the job's hash, RQ's queue set, the new band's flows and
# bell, the old queue's deadline set and the new one's. ARGV: the job id, the new queue's name,
# now, its tenant, the bell's length, the hash's deadline field.
_MOVE = (
    INSERT_AT
    + """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  local deadline = redis.call('HGET', KEYS[3], ARGV[6])
  local at
  if deadline then
    redis.call('ZREM', KEYS[7], ARGV[1])
    at = redis.call('ZCOUNT', KEYS[8], '-inf', deadline)
    redis.call('ZADD', KEYS[8], deadline, ARGV[1])
  else
    at = redis.call('ZCARD', KEYS[8])
  end
  insert_at(KEYS[2], at, ARGV[1])
  redis.call('SADD', KEYS[4], KEYS[2])
  redis.call('HSET', KEYS[3], 'origin', ARGV[2], 'enqueued_at', ARGV[3])
  redis.call('SADD', KEYS[5], ARGV[4])
  redis.call('RPUSH', KEYS[6], 1)
  redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[5]) - 1)
  return 1
end
return 0
"""
)


def gpuq_queues(redis: Redis) -> list[tuple[str, QueueName]]:
    """(queue name, what it is made of) of every gpuq queue RQ knows, tenants' included."""
    found = []
    # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
    for key in cast(set[bytes], redis.smembers(RQ_QUEUES)):
        name = key.decode().removeprefix(RQ_QUEUE_PREFIX)
        try:
            found.append((name, parse_queue(name)))
        except ValueError:
            continue  # another application's queue
    return found


def promote_aged_jobs(redis: Redis, *, aging_s: float, now: datetime | None = None) -> list[str]:
    """Move every job that waited ``aging_s`` up one priority; returns the ids moved."""
    if aging_s <= 0:
        return []
    now = now or utcnow()
    cutoff = now - timedelta(seconds=aging_s)
    move = redis.register_script(_MOVE)
    moved = []
    for name, parsed in gpuq_queues(redis):
        if parsed.priority == Priority.HIGH:
            continue
        target_band = band_name(parsed.model, parsed.kind, Priority(parsed.priority - 1))
        target = f"{target_band}:{parsed.tenant}" if parsed.tenant else target_band  # the same tenant's
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
                fair_flows_key(target_band),
                fair_bell_key(target_band),
                fair_edf_key(name),
                fair_edf_key(target),
            ]
            args: list[str | int] = [
                job_id,
                target,
                utcformat(now),
                parsed.tenant,
                FAIR_BELL_MAX,
                JOB_DEADLINE_FIELD,
            ]
            if move(keys=keys, args=args):
                moved.append(job_id)
    return moved
