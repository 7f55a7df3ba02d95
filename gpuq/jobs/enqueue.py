"""Putting jobs into Redis with RQ: one pipeline for any number of jobs.

The RQ job id is the gpuq job id, and the RQ job carries only that id: the request
itself lives in SQL, the system of record, so Redis never holds a second copy that
could drift. ``result_ttl=0`` because results are written to SQL, not to Redis.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from collections.abc import Iterable

from redis import Redis
from rq.utils import now as rq_now
from rq.utils import utcformat

from gpuq.jobs.queues import JOB_FUNC
from gpuq.queue_names import QueueEntry, parse_queue
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    FAIR_EDF_PREFIX,
    JOB_DEADLINE_FIELD,
    JOB_LANED_AT_FIELD,
    LANES_KEY,
    RQ_JOB_PREFIX,
    RQ_QUEUE_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_edf_key,
    fair_flows_key,
    fair_lane_flows_key,
    lane_queues_key,
    rq_job_key,
    rq_queue_key,
)

FAILURE_TTL_S = 7 * 24 * 3600
SCRIPT_CHUNK = 2000  # jobs per script call


# Writes RQ's job hash (the fields of ``rq.job.Job.to_dict`` a worker reads) and queues the id,
# for many jobs of one queue in one call, inside Redis; then adds the queue's tenant to its
# band's flows (a lane's queue: ``<tenant>@<lane>`` to the band's lane flows) and rings the
# band's bell once per job (up to its length), so the fair pick sees the queue and idle workers
# wake (``gpuq.jobs.fair``). ARGV 9 and 10: the job hash's lane time field and now (ms), for a
# lane's jobs ('' otherwise: stealing's clock); from 11: each job's id and deadline (ms; '' for
# none).
#
# The list is kept in the order the pick gives jobs out: jobs with a deadline first, earliest
# first, then the others, each part in queueing order. Jobs without one are pushed at the end.
# Those with one are merged in: the list from the first place where one of them goes (the
# deadline jobs due after the earliest new one, then the jobs without a deadline) is taken
# off, merged with them, and pushed back; so the cost is the length of that tail, which is
# nothing in the usual case of a batch's lines (one deadline, later than those waiting, and no
# jobs without one behind them), and the pick stays one LPOP.
_ENQUEUE = """
local origin, now, timeout, failure_ttl, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local tenant, bell_max, deadline_field = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local laned_field, laned_at = ARGV[9], ARGV[10]
local list, edf = KEYS[1], KEYS[6]
local function push(ids, first, last)
  for s = first, last, 1000 do
    redis.call('RPUSH', list, unpack(ids, s, math.min(s + 999, last)))
  end
end
redis.call('SADD', KEYS[2], list)
local plain, dated = {}, {}
for i = 11, #ARGV, 2 do
  local id, deadline = ARGV[i], ARGV[i + 1]
  redis.call('HSET', KEYS[3] .. id, 'data', data, 'created_at', now, 'enqueued_at', now,
             'origin', origin, 'status', 'queued', 'description', 'gpuq ' .. id, 'timeout', timeout,
             'result_ttl', 0, 'failure_ttl', failure_ttl)
  if laned_field ~= '' then redis.call('HSET', KEYS[3] .. id, laned_field, laned_at) end
  if deadline == '' then
    table.insert(plain, id)
  else
    redis.call('HSET', KEYS[3] .. id, deadline_field, deadline)
    table.insert(dated, {tonumber(deadline), #dated, id, deadline})
  end
end
if #dated > 0 then
  table.sort(dated, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local from = redis.call('ZCOUNT', edf, '-inf', dated[1][1])
  local later = redis.call('ZRANGE', edf, from, -1, 'WITHSCORES')
  local tail = redis.call('LRANGE', list, from, -1)
  if from == 0 then redis.call('DEL', list) else redis.call('LTRIM', list, 0, from - 1) end
  local merged, i, j = {}, 1, 1
  local held = #later / 2
  while i <= held or j <= #dated do
    if j > #dated or (i <= held and tonumber(later[2 * i]) <= dated[j][1]) then
      table.insert(merged, tail[i])
      i = i + 1
    else
      table.insert(merged, dated[j][3])
      redis.call('ZADD', edf, dated[j][4], dated[j][3])
      j = j + 1
    end
  end
  for k = held + 1, #tail do table.insert(merged, tail[k]) end
  push(merged, 1, #merged)
end
push(plain, 1, #plain)
local count = (#ARGV - 10) / 2
redis.call('SADD', KEYS[4], tenant)
local rings = math.min(count, bell_max)
for i = 1, rings do redis.call('RPUSH', KEYS[5], 1) end
redis.call('LTRIM', KEYS[5], 0, bell_max - 1)
return count
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
        deadline = entry.deadline_ms
        by_queue[entry.queue] += [entry.job_id, "" if deadline is None else str(deadline)]  # a tenant's queue
    now = utcformat(rq_now())
    now_ms = str(int(time.time() * 1000))
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
                fair_lane_flows_key(band) if parsed.lane else fair_flows_key(band),
                fair_bell_key(band),
                fair_edf_key(name),
            ]
            if parsed.lane:
                pipe.sadd(lane_queues_key(parsed.lane), name)
                pipe.sadd(LANES_KEY, parsed.lane)
            for start in range(0, len(ids), 2 * SCRIPT_CHUNK):
                args: list[str | int | bytes] = [
                    name,
                    now,
                    timeout_s,
                    FAILURE_TTL_S,
                    call,
                    f"{parsed.tenant}@{parsed.lane}" if parsed.lane else parsed.tenant,
                    FAIR_BELL_MAX,
                    JOB_DEADLINE_FIELD,
                    JOB_LANED_AT_FIELD if parsed.lane else "",
                    now_ms if parsed.lane else "",
                ]
                args.extend(ids[start : start + 2 * SCRIPT_CHUNK])
                script(keys=keys, args=args, client=pipe)
        pipe.execute()


# KEYS: the queue its row names, the job's hash. ARGV: the job id, RQ's queue prefix, the
# deadline sets' prefix. Out of the queue its hash says it waits in (a worker's lane, or a
# queue aging moved it to) and of the one its row names, then the hash.
_REMOVE = """
local origin = redis.call('HGET', KEYS[2], 'origin')
if origin and ARGV[2] .. origin ~= KEYS[1] then
  redis.call('LREM', ARGV[2] .. origin, 0, ARGV[1])
  redis.call('ZREM', ARGV[3] .. origin, ARGV[1])
end
redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('ZREM', ARGV[3] .. string.sub(KEYS[1], #ARGV[2] + 1), ARGV[1])
redis.call('DEL', KEYS[2])
"""


def remove_queued(redis: Redis, entries: Iterable[QueueEntry]) -> None:
    """Take jobs out of their queues, and out of their deadline sets (cancelled before a worker
    took them): the queue RQ's hash names as the job's (a lane's, say) and the one its row
    names. A tenant's queue left empty stays among its band's flows until the next pick passes
    over it."""
    script = redis.register_script(_REMOVE)
    with redis.pipeline(transaction=True) as pipe:
        for e in entries:
            script(
                keys=[rq_queue_key(e.queue), rq_job_key(e.job_id)],
                args=[e.job_id, RQ_QUEUE_PREFIX, FAIR_EDF_PREFIX],
                client=pipe,
            )
        pipe.execute()
