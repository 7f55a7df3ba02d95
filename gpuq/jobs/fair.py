"""Fair shares between tenants within a priority: a weighted pick over per-tenant queues.

Jobs of one model, kind and priority (a *band*) wait in one RQ queue per tenant
(``gpuq.queue_names``). A worker takes the next job of a band with one Lua call that picks
among the band's non-empty tenant queues (those in its flows set, and always the band's own
queue, of jobs of no tenant) by start-time fair queuing (stride scheduling):

* each tenant has a *pass*, the virtual time of its next job, and the band a virtual time
  ``V``, the pass of the last job taken;
* the pick takes the tenant with the smallest ``max(pass, V)`` (ties: the tenant segment
  that sorts first), pops its queue's front, and advances its pass by ``QUANTUM // weight``;
* so a tenant that was idle starts at ``V``, with neither credit for the time it was away
  nor debt from before; while several tenants wait, each gets jobs in proportion to its
  weight, and a tenant that arrives behind another's 50,000 jobs waits about one round.

Within a tenant's queue, jobs with a deadline go first, earliest deadline first (equal ones in
the order they were queued), then the others in the order they were queued. The queue's RQ list
is kept in that order (a job with a deadline is merged in at its place when it is queued,
``gpuq.jobs.enqueue``), so the pick still pops the list's front and a position is still the
job's index in it; a sorted set beside the list (``gpuq.redis_keys.fair_edf_key``) holds the
deadlines of its deadline jobs, to find where a new one goes. A tenant's deadlines thus order
its own jobs and never buy it a larger share.

Lanes (``gpuq.jobs.prefix_routing``): a job placed on a worker by its prompt's start waits in
that worker's lane, one more queue of its tenant in the band (its tenant kept in the band's
lane flows, ``gpuq.redis_keys.fair_lane_flows_key``). A worker's pick counts a tenant's
shared queue, its own lane's queue, and other lanes' queues whose first job has waited past the
steal bound, and chooses the tenant by its pass over all of them; within the tenant its own
lane goes first, then the shared queue, then the most overdue other lane. So a lane changes
only which of a tenant's jobs of one priority a worker takes, never whose turn it is.

Priorities stay strict: the worker's ordered list of bands (``gpuq.jobs.queues``) is walked
in order and the first band with a job gives it. Idle workers block (``BLPOP``) on their
bands' *bells* (``gpuq.redis_keys.fair_bell_key``), to which every push adds a token,
instead of on the queues themselves, whose set changes with the tenants.

The pick is exact over a snapshot of the passes and queue lengths, so a queued job's place
(``jobs_ahead``) is computed from the same rule: the tenant ``f``'s ``j``-th job has virtual
time ``max(pass_f, V) + j * stride_f``, and jobs leave in the order of (virtual time, tenant).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from redis import Redis
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.queue_names import parse_queue, tenant_segment
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    FAIR_EDF_PREFIX,
    FAIR_WEIGHTS_KEY,
    JOB_DEADLINE_FIELD,
    JOB_LANED_AT_FIELD,
    RQ_JOB_PREFIX,
    RQ_QUEUE_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_edf_key,
    fair_flows_key,
    fair_lane_flows_key,
    fair_passes_key,
    rq_job_key,
    rq_queue_key,
)

QUANTUM = 720_720  # divisible by every weight from 1 to 16: strides stay whole numbers
MAX_WEIGHT = 1000
DEFAULT_WEIGHT = 1
STEAL_S = 5.0  # GPUQ_PREFIX_ROUTING_STEAL_S's default: a lane's first job waits this long before others take it


def stride(weight: int) -> int:
    """How far a tenant's pass moves per job: a weight twice as large, half as far."""
    return QUANTUM // max(1, min(weight, MAX_WEIGHT))


# Puts a job at index ``at`` of a list (a job's place among its queue's deadline jobs, or at
# the front of the others): the list stays the order the pick gives jobs out in.
INSERT_AT = """
local function insert_at(list, at, id)
  if at == 0 then return redis.call('LPUSH', list, id) end
  local before = redis.call('LINDEX', list, at - 1)
  if not before then return redis.call('RPUSH', list, id) end
  return redis.call('LINSERT', list, 'AFTER', before, id)
end
"""

# KEYS: the weights hash, then per band its flows set, passes hash, bell and lane flows set.
# ARGV: mode ('pop', 'peek'), accepted band numbers (',1,3,' or '' for all), quantum, RQ's
# queue prefix, the deadline sets' prefix, RQ's job prefix, this worker's lane ('' for none),
# now (ms), the steal bound (ms), the job hash's lane time field, then each band's name.
# Returns {queue name, job id, how} (how: 'shared', 'own' for its lane, 'stolen' from another's
# whose first job waited past the bound), or {'', '', ms} when nothing is to be had now but
# a lane's first job may be stolen in ms, or false.
#
# A tenant's candidates are its shared queue, its queue in this worker's lane, and its queues
# in other lanes whose first job is overdue. The tenant is chosen by its pass over all of them
# (fair shares first); within the tenant, this worker's lane goes first, then the shared queue,
# then the most overdue other lane.
_PICK = """
local mode, accept, quantum, prefix, edf_prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local job_prefix, lane, now, steal_ms, laned_field = ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
local bands = (#KEYS - 1) / 4
local steal_in
for b = 1, bands do
  local flows, passes, lane_flows = KEYS[4 * b - 2], KEYS[4 * b - 1], KEYS[4 * b + 1]
  local band = ARGV[10 + b]
  local members = redis.call('SMEMBERS', flows)
  if redis.call('SISMEMBER', flows, '') == 0 then table.insert(members, '') end
  local shared, own, stolen, stolen_at = {}, {}, {}, {}
  local tenants = {}
  for _, t in ipairs(members) do
    local name = band
    if t ~= '' then name = band .. ':' .. t end
    if redis.call('LLEN', prefix .. name) > 0 then
      shared[t] = name
      tenants[t] = true
    else
      redis.call('SREM', flows, t)
    end
  end
  for _, m in ipairs(redis.call('SMEMBERS', lane_flows)) do
    local at_sign = string.find(m, '@', 1, true)
    local t, l = string.sub(m, 1, at_sign - 1), string.sub(m, at_sign + 1)
    local name = band .. ':' .. m
    local head = redis.call('LINDEX', prefix .. name, 0)
    if not head then
      redis.call('SREM', lane_flows, m)
    elseif l == lane then
      own[t] = name
      tenants[t] = true
    else
      local laned = tonumber(redis.call('HGET', job_prefix .. head, laned_field) or '0')
      local due = laned + steal_ms - now
      if due <= 0 then
        if stolen[t] == nil or laned < stolen_at[t] then stolen[t], stolen_at[t] = name, laned end
        tenants[t] = true
      elseif steal_in == nil or due < steal_in then
        steal_in = due
      end
    end
  end
  local v = tonumber(redis.call('HGET', passes, '@') or '0')
  local best, best_at
  for t, _ in pairs(tenants) do
    local at = tonumber(redis.call('HGET', passes, t) or '0')
    if at < v then at = v end
    if best == nil or at < best_at or (at == best_at and t < best) then best, best_at = t, at end
  end
  if best ~= nil then
    if accept ~= '' and not string.find(accept, ',' .. b .. ',', 1, true) then return false end
    local name, how = own[best], 'own'
    if name == nil then name, how = shared[best], 'shared' end
    if name == nil then name, how = stolen[best], 'stolen' end
    if mode == 'peek' then return {name, redis.call('LINDEX', prefix .. name, 0), how} end
    local id = redis.call('LPOP', prefix .. name)
    redis.call('ZREM', edf_prefix .. name, id)
    local w = tonumber(redis.call('HGET', KEYS[1], best) or '1')
    if w < 1 then w = 1 end
    redis.call('HSET', passes, best, string.format('%.0f', best_at + math.floor(quantum / w)),
               '@', string.format('%.0f', best_at))
    return {name, id, how}
  end
end
if mode == 'pop' and accept == '' then
  for b = 1, bands do redis.call('DEL', KEYS[4 * b]) end
end
if steal_in ~= nil then return {'', '', string.format('%.0f', steal_in)} end
return false
"""

# A consistent snapshot of one band for positions: V, then per tenant its queue's length,
# pass (or '') and weight (or ''); ARGV[3], a tenant to include even with no jobs waiting.
_SNAPSHOT = """
local flows, passes, weights, prefix, band = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
local out = {redis.call('HGET', passes, '@') or '0'}
local members = redis.call('SMEMBERS', flows)
if redis.call('SISMEMBER', flows, '') == 0 then table.insert(members, '') end
if ARGV[3] ~= '' and redis.call('SISMEMBER', flows, ARGV[3]) == 0 then table.insert(members, ARGV[3]) end
for _, t in ipairs(members) do
  local name = band
  if t ~= '' then name = band .. ':' .. t end
  table.insert(out, t)
  table.insert(out, redis.call('LLEN', prefix .. name))
  table.insert(out, redis.call('HGET', passes, t) or '')
  table.insert(out, redis.call('HGET', weights, t) or '')
end
return out
"""


class Picker:
    """A worker's ordered bands (``gpuq.jobs.queues.worker_queue_names``) as one pick, with its
    lane (``gpuq.jobs.placement``: its worker name; "" for a reader that has none)."""

    def __init__(self, redis: Redis, bands: Sequence[str], *, lane: str = "", steal_s: float = STEAL_S) -> None:
        self._redis = redis
        self.bands = list(bands)
        self.lane = lane
        self.steal_ms = int(steal_s * 1000)
        self._keys = [FAIR_WEIGHTS_KEY]
        for band in self.bands:
            self._keys += [
                fair_flows_key(band),
                fair_passes_key(band),
                fair_bell_key(band),
                fair_lane_flows_key(band),
            ]
        self.bells = [fair_bell_key(band) for band in self.bands]
        self._script = redis.register_script(_PICK)
        self.steal_in_s: float | None = None  # after a pick that found nothing: when a lane's job may be stolen
        self.last_how = ""  # how the last job taken was placed: 'shared', 'own', 'stolen'

    def take(self, *, only: Sequence[str] | None = None) -> tuple[str, str] | None:
        """Pops the next job of the first band in order that has one: (queue name, job id).
        ``only``: bands it may come from; when the first band with a job is another, nothing
        is taken (a more urgent job waits elsewhere). Taking nothing at all clears the bells."""
        accept = "" if only is None else "," + ",".join(str(i + 1) for i, b in enumerate(self.bands) if b in only) + ","
        if only is not None and accept == ",,":
            return None
        return self._call("pop", accept)

    def peek(self) -> tuple[str, str] | None:
        """What ``take`` would pop, left in place."""
        return self._call("peek", "")

    def _call(self, mode: str, accept: str) -> tuple[str, str] | None:
        self.steal_in_s = None
        if not self.bands:
            return None
        args: list[str | int] = [
            mode,
            accept,
            QUANTUM,
            RQ_QUEUE_PREFIX,
            FAIR_EDF_PREFIX,
            RQ_JOB_PREFIX,
            self.lane,
            int(time.time() * 1000),
            self.steal_ms,
            JOB_LANED_AT_FIELD,
            *self.bands,
        ]
        found = cast(list[bytes] | None, self._script(keys=self._keys, args=args))
        if not found:
            return None
        if not found[0]:
            self.steal_in_s = int(found[2]) / 1000
            return None
        self.last_how = found[2].decode()
        return found[0].decode(), found[1].decode()

    def wait(self, timeout_s: int) -> bool:
        """Blocks until a push to one of the bands rings (True) or ``timeout_s`` passes (or,
        sooner, a lane's first job may be stolen)."""
        if not self.bells:
            return False
        wait_s: float = timeout_s
        if self.steal_in_s is not None:
            wait_s = max(0.05, min(wait_s, self.steal_in_s + 0.01))
        return self._redis.blpop(self.bells, wait_s) is not None


def note_push(pipe: Pipeline, queue: str) -> None:
    """What a push to a queue owes the fair pick, in the caller's pipeline: its tenant among
    the band's flows, and a token on the band's bell."""
    parsed = parse_queue(queue)
    band = parsed.band
    if parsed.lane:
        pipe.sadd(fair_lane_flows_key(band), f"{parsed.tenant}@{parsed.lane}")
    else:
        pipe.sadd(fair_flows_key(band), parsed.tenant)
    pipe.rpush(fair_bell_key(band), 1)
    pipe.ltrim(fair_bell_key(band), 0, FAIR_BELL_MAX - 1)


# KEYS: the queue's list, the job's hash, the queue's deadline set. ARGV: the job id, the hash's
# deadline field. Back in front of the jobs due later (or, without a deadline, in front of the
# others without one).
_PUSH_FRONT = (
    INSERT_AT
    + """
local deadline = redis.call('HGET', KEYS[2], ARGV[2])
local at
if deadline then
  at = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. deadline)
  redis.call('ZADD', KEYS[3], deadline, ARGV[1])
else
  at = redis.call('ZCARD', KEYS[3])
end
insert_at(KEYS[1], at, ARGV[1])
"""
)


def push_front_in(pipe: Pipeline, queue: str, job_id: str) -> None:
    """In the caller's pipeline: back to the front of its queue (a job popped and not run): of
    its deadline jobs, when it has a deadline (before those due later), else of the others."""
    script = pipe.register_script(_PUSH_FRONT)
    keys = [rq_queue_key(queue), rq_job_key(job_id), fair_edf_key(queue)]
    script(keys=keys, args=[job_id, JOB_DEADLINE_FIELD], client=pipe)
    note_push(pipe, queue)


def push_front(redis: Redis, queue: str, job_id: str) -> None:
    """``push_front_in``, on its own, ready for the next pick."""
    with redis.pipeline(transaction=True) as pipe:
        push_front_in(pipe, queue, job_id)
        pipe.execute()


@dataclass(frozen=True, slots=True)
class Flow:
    tenant: str  # its tenant segment
    length: int
    start: int  # the virtual time of its next job: max(its pass, the band's)
    stride: int


@dataclass(frozen=True, slots=True)
class BandState:
    vtime: int
    flows: dict[str, Flow]  # by tenant segment

    @property
    def depth(self) -> int:
        return sum(f.length for f in self.flows.values())

    def jobs_ahead(self, tenant: str, index: int) -> int:
        """Jobs of the band taken before the one at ``index`` in ``tenant``'s queue, by the
        pick's own rule over this snapshot (later arrivals of other tenants may yet go first)."""
        return sum(self.ahead_by_tenant(tenant, index).values())

    def ahead_by_tenant(self, tenant: str, index: int) -> dict[str, int]:
        """``jobs_ahead`` tenant by tenant: how many of each tenant's first jobs go before the
        one at ``index`` in ``tenant``'s queue (its own first ``index``), tenants with none left out."""
        own = self.flows.get(tenant)
        if own is None:
            return {tenant: index} if index else {}
        at = own.start + index * own.stride
        ahead = {tenant: index} if index else {}
        for other in self.flows.values():
            if other.tenant == tenant:
                continue
            # Its j-th job goes first when (start + j * stride, its tenant) < (at, ours).
            gap = at - other.start
            if other.tenant < tenant:
                before = gap // other.stride + 1 if gap >= 0 else 0
            else:
                before = (gap - 1) // other.stride + 1 if gap > 0 else 0
            if n := min(other.length, before):
                ahead[other.tenant] = n
        return ahead

    def order(self) -> list[tuple[str, int]]:
        """Every waiting job of the band as (tenant, index in its queue), in the order the
        pick takes them over this snapshot."""
        tags = [(f.start + j * f.stride, f.tenant, j) for f in self.flows.values() for j in range(f.length)]
        return [(t, j) for _at, t, j in sorted(tags)]


def band_state(redis: Redis, band: str, *, tenant: str = "") -> BandState:
    """The band's flows now; ``tenant``'s among them even when it has no job waiting (where a
    job of its would go)."""
    raw = cast(
        list[bytes | int],
        redis.register_script(_SNAPSHOT)(
            keys=[fair_flows_key(band), fair_passes_key(band), FAIR_WEIGHTS_KEY], args=[RQ_QUEUE_PREFIX, band, tenant]
        ),
    )
    vtime = int(cast(bytes, raw[0]))
    flows = {}
    for i in range(1, len(raw), 4):
        tenant = cast(bytes, raw[i]).decode()
        length = int(raw[i + 1])
        passed, weight = cast(bytes, raw[i + 2]), cast(bytes, raw[i + 3])
        start = max(int(passed) if passed else 0, vtime)
        flows[tenant] = Flow(tenant, length, start, stride(int(weight) if weight else DEFAULT_WEIGHT))
    return BandState(vtime, flows)


def first_in_queue(redis: Redis, queue: str, count: int) -> list[str]:
    """The first ``count`` jobs its queue gives out, in that order."""
    if count <= 0:
        return []
    return [i.decode() for i in cast(list[bytes], redis.lrange(rq_queue_key(queue), 0, count - 1))]


def place_for(redis: Redis, queue: str, deadline_ms: int | None) -> int:
    """Where a job queued now would stand in its queue: behind every deadline up to its own
    (equal ones queued earlier go first), or behind every job when it has no deadline."""
    if deadline_ms is None:
        return redis.llen(rq_queue_key(queue))
    return redis.zcount(fair_edf_key(queue), "-inf", deadline_ms)


def set_weights(redis: Redis, weights: dict[str, int]) -> None:
    """Every tenant's weight (by tenant segment), replacing what Redis held: the rebuild from
    SQL. Tenants left out weigh ``DEFAULT_WEIGHT``."""
    with redis.pipeline(transaction=True) as pipe:
        pipe.delete(FAIR_WEIGHTS_KEY)
        if weights:
            mapping: dict[FieldT, EncodableT] = dict(weights.items())
            pipe.hset(FAIR_WEIGHTS_KEY, mapping=mapping)
        pipe.execute()


def set_weight(redis: Redis, tenant: str, weight: int) -> None:
    if weight == DEFAULT_WEIGHT:
        redis.hdel(FAIR_WEIGHTS_KEY, tenant)
    else:
        redis.hset(FAIR_WEIGHTS_KEY, tenant, weight)


def register_flows(redis: Redis) -> int:
    """The backstop for a push that bypassed gpuq (``rq requeue``, say): every non-empty gpuq
    queue's tenant among its band's flows, and a bell rung for it. Returns the tenants added."""
    names = []
    for key in cast(set[bytes], redis.smembers(RQ_QUEUES)):
        name = key.decode().removeprefix(RQ_QUEUE_PREFIX)
        try:
            names.append((name, parse_queue(name)))
        except ValueError:
            continue
    if not names:
        return 0
    with redis.pipeline(transaction=False) as pipe:
        for name, parsed in names:
            pipe.llen(rq_queue_key(name))
            if parsed.lane:
                pipe.sismember(fair_lane_flows_key(parsed.band), f"{parsed.tenant}@{parsed.lane}")
            else:
                pipe.sismember(fair_flows_key(parsed.band), parsed.tenant)
        raw = pipe.execute()
    missing = [
        name for (name, _p), length, member in zip(names, raw[::2], raw[1::2], strict=True) if length and not member
    ]
    if missing:
        with redis.pipeline(transaction=True) as pipe:
            for name in missing:
                note_push(pipe, name)
            pipe.execute()
    return len(missing)


def weights_by_tenant(owner_weights: dict[str, int]) -> dict[str, int]:
    """SQL's tenant weights (``store.tenant_weights``) as the pick reads them: by tenant
    segment, the default left out."""
    return {tenant_segment(owner): w for owner, w in owner_weights.items() if w != DEFAULT_WEIGHT}


def sync_weights(session: Session, redis: Redis) -> None:
    """Redis's weights rebuilt from SQL (the reconciler's every pass, and a key's change)."""
    set_weights(redis, weights_by_tenant(store.tenant_weights(session)))
