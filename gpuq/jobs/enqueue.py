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

from gpuq.jobs.fair import EDF_SEQ_DIGITS
from gpuq.jobs.queues import JOB_FUNC
from gpuq.queue_names import QueueEntry, parse_queue
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    FAIR_EDF_SEQ_KEY,
    JOB_DEADLINE_FIELD,
    JOB_EDF_FIELD,
    RQ_JOB_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_edf_key,
    fair_flows_key,
    rq_job_key,
    rq_queue_key,
)

FAILURE_TTL_S = 7 * 24 * 3600
SCRIPT_CHUNK = 2000  # jobs per script call


# Writes RQ's job hash (the fields of ``rq.job.Job.to_dict`` a worker reads) and pushes the
# id, for many jobs of one queue in one call, inside Redis; a job with a deadline also joins
# the queue's deadline set (its member, numbered in queueing order, and its deadline noted in
# its hash); then adds the queue's tenant to its band's flows and rings the band's bell once
# per job (up to its length), so the fair pick sees the queue and idle workers wake
# (``gpuq.jobs.fair``). ARGV from 10: each job's id and deadline (ms; '' for none).
_ENQUEUE = """
local origin, now, timeout, failure_ttl, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tenant, bell_max, edf_field, deadline_field = ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9]
redis.call('SADD', KEYS[2], KEYS[1])
local dated = 0
for i = 11, #ARGV, 2 do
  if ARGV[i] ~= '' then dated = dated + 1 end
end
local seq = 0
if dated > 0 then seq = redis.call('INCRBY', KEYS[7], dated) - dated end
for i = 10, #ARGV, 2 do
  local id, deadline = ARGV[i], ARGV[i + 1]
  redis.call('HSET', KEYS[3] .. id, 'data', data, 'created_at', now, 'enqueued_at', now,
             'origin', origin, 'status', 'queued', 'description', 'gpuq ' .. id, 'timeout', timeout,
             'result_ttl', 0, 'failure_ttl', failure_ttl)
  if deadline ~= '' then
    seq = seq + 1
    local member = string.format('%0SEQx', seq) .. id
    redis.call('HSET', KEYS[3] .. id, edf_field, member, deadline_field, deadline)
    redis.call('ZADD', KEYS[6], deadline, member)
  end
  redis.call('RPUSH', KEYS[1], id)
end
local count = (#ARGV - 9) / 2
redis.call('SADD', KEYS[4], tenant)
local rings = math.min(count, bell_max)
for i = 1, rings do redis.call('RPUSH', KEYS[5], 1) end
redis.call('LTRIM', KEYS[5], 0, bell_max - 1)
return count
""".replace("SEQ", str(EDF_SEQ_DIGITS))


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
        deadline = entry.deadline_ms
        by_queue[entry.queue] += [entry.job_id, "" if deadline is None else str(deadline)]  # a tenant's queue
    now = utcformat(rq_now())
    call = pickle.dumps((JOB_FUNC, None, (), {}), protocol=pickle.HIGHEST_PROTOCOL)  # the same for every job
    script = redis.register_script(_ENQUEUE)
    with redis.pipeline(transaction=True) as pipe:
        for name, ids in by_queue.items():
            parsed = parse_queue(name)
            band = parsed.band
            keys = [
                rq_queue_key(name),
                RQ_QUEUES,
                RQ_JOB_PREFIX,
                fair_flows_key(band),
                fair_bell_key(band),
                fair_edf_key(name),
                FAIR_EDF_SEQ_KEY,
            ]
            for start in range(0, len(ids), 2 * SCRIPT_CHUNK):
                args: list[str | int | bytes] = [
                    name,
                    now,
                    timeout_s,
                    FAILURE_TTL_S,
                    call,
                    parsed.tenant,
                    FAIR_BELL_MAX,
                    JOB_EDF_FIELD,
                    JOB_DEADLINE_FIELD,
                ]
                args.extend(ids[start : start + 2 * SCRIPT_CHUNK])
                script(keys=keys, args=args, client=pipe)
        pipe.execute()


# KEYS: the queue's list, the job's hash, the queue's deadline set. ARGV: the job id, the hash's
# field naming its member of that set.
_REMOVE = """
local member = redis.call('HGET', KEYS[2], ARGV[2])
if member then redis.call('ZREM', KEYS[3], member) end
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('DEL', KEYS[2])
"""


def remove_queued(redis: Redis, entries: Iterable[QueueEntry]) -> None:
    """Take jobs out of their queues, and out of their deadline sets (cancelled before a worker
    took them). A tenant's queue left empty stays among its band's flows until the next pick
    passes over it."""
    script = redis.register_script(_REMOVE)
    with redis.pipeline(transaction=True) as pipe:
        for e in entries:
            keys = [rq_queue_key(e.queue), rq_job_key(e.job_id), fair_edf_key(e.queue)]
            script(keys=keys, args=[e.job_id, JOB_EDF_FIELD], client=pipe)
        pipe.execute()
