"""Putting jobs into Redis with RQ: one pipeline for any number of jobs.

The RQ job id is the gpuq job id, and the RQ job carries only that id: the request
itself lives in SQL, the system of record, so Redis never holds a second copy that
could drift. ``result_ttl=0`` because results are written to SQL, not to Redis.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Iterable

from redis import Redis
from rq.utils import now as rq_now
from rq.utils import utcformat

from gpuq.jobs.queues import JOB_FUNC
from gpuq.queue_names import QueueEntry, parse_queue
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    RQ_JOB_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_flows_key,
    rq_job_key,
    rq_queue_key,
)

FAILURE_TTL_S = 7 * 24 * 3600
SCRIPT_CHUNK = 2000  # jobs per script call


# Writes RQ's job hash (the fields of ``rq.job.Job.to_dict`` a worker reads) and pushes the
# id, for many jobs of one queue in one call, inside Redis; then adds the queue's tenant to
# its band's flows and rings the band's bell once per job (up to its length), so the fair
# pick sees the queue and idle workers wake (``gpuq.jobs.fair``).
_ENQUEUE = """
local origin, now, timeout, failure_ttl, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tenant, bell_max = ARGV[6], tonumber(ARGV[7])
redis.call('SADD', KEYS[2], KEYS[1])
for i = 8, #ARGV do
  local id = ARGV[i]
  redis.call('HSET', KEYS[3] .. id, 'data', data, 'created_at', now, 'enqueued_at', now,
             'origin', origin, 'status', 'queued', 'description', 'gpuq ' .. id, 'timeout', timeout,
             'result_ttl', 0, 'failure_ttl', failure_ttl)
  redis.call('RPUSH', KEYS[1], id)
end
redis.call('SADD', KEYS[4], tenant)
local rings = math.min(#ARGV - 7, bell_max)
for i = 1, rings do redis.call('RPUSH', KEYS[5], 1) end
redis.call('LTRIM', KEYS[5], 0, bell_max - 1)
return #ARGV - 7
"""


def enqueue_jobs(redis: Redis, entries: Iterable[QueueEntry], *, timeout_s: int) -> None:
    """Enqueue every entry in one Redis round trip (MULTI/EXEC, all or nothing).

    The RQ job hashes and queue entries are the ones ``Queue.enqueue_many`` would write,
    so RQ's workers and tools read them as their own; but they are written by a
    server-side script, many jobs a call, which costs about a tenth of ``enqueue_many``
    per job: it matters for a 50,000-line batch. The pickled call is stored uncompressed
    (RQ reads both) and carries no arguments (the job id is RQ's own): every field then
    stays under Redis's ``hash-max-listpack-value`` (64 bytes), so the hash is a compact
    listpack of about 300 bytes instead of a hash table of about 1 KB."""
    by_queue: dict[str, list[str]] = defaultdict(list)
    for entry in entries:
        by_queue[entry.queue].append(entry.job_id)  # a tenant's queue in its band
    now = utcformat(rq_now())
    call = pickle.dumps((JOB_FUNC, None, (), {}), protocol=pickle.HIGHEST_PROTOCOL)  # the same for every job
    script = redis.register_script(_ENQUEUE)
    with redis.pipeline(transaction=True) as pipe:
        for name, ids in by_queue.items():
            parsed = parse_queue(name)
            band = parsed.band
            keys = [rq_queue_key(name), RQ_QUEUES, RQ_JOB_PREFIX, fair_flows_key(band), fair_bell_key(band)]
            for start in range(0, len(ids), SCRIPT_CHUNK):
                args: list[str | int | bytes] = [
                    name,
                    now,
                    timeout_s,
                    FAILURE_TTL_S,
                    call,
                    parsed.tenant,
                    FAIR_BELL_MAX,
                ]
                args.extend(ids[start : start + SCRIPT_CHUNK])
                script(keys=keys, args=args, client=pipe)
        pipe.execute()


def remove_queued(redis: Redis, entries: Iterable[QueueEntry]) -> None:
    """Take jobs out of their queues (cancelled before a worker took them). A tenant's queue
    left empty stays among its band's flows until the next pick passes over it."""
    with redis.pipeline(transaction=True) as pipe:
        for e in entries:
            pipe.lrem(rq_queue_key(e.queue), 0, e.job_id)
            pipe.delete(rq_job_key(e.job_id))
        pipe.execute()
