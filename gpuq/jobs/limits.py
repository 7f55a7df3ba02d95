"""Per-key limits: how many jobs a key may have queued, and how fast it may submit.

The submission rate is a token bucket in Redis (one Lua call, atomic across API
processes): a key may submit ``max_submissions_per_minute`` jobs at once, then refills at
that rate. A job submitted alone or in a bulk request counts one per job; a batch counts
one, because its size is what ``max_queued_jobs`` bounds.

The queued-jobs limit counts the key's queued rows in SQL, so it is exact after a
restart; the key is held (``store.hold_key_until_commit``) from the count until the new
jobs are committed, so concurrent requests, from any number of API processes, cannot
together overshoot it.
Both answer 429 with a ``Retry-After`` that says when trying again can succeed.

Every admission holds the key, limits or not, and is refused (401) if the key was revoked
since the request authenticated: a revocation that cancels the key's jobs
(gpuq/jobs/actions.py) then leaves none behind it.

Before a request's costly checks (tokenising its prompt), ``precheck`` answers the 429 a
key already over a limit will get, spending nothing: refused work stays cheap. And
``tokenising_turn`` lets each tenant tokenise one request at a time in this process, so one
tenant's long prompts queue behind each other, not in front of everyone's
(gpuq/jobs/prompt.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio import to_thread
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from gpuq import store
from gpuq.auth.access import Caller
from gpuq.errors import RequestError, queue_unavailable
from gpuq.redis_keys import rate_limit_key

# Retry-After for a full queue: the queue drains at the fleet's pace, which this check
# does not know; a few seconds keeps clients from hammering without making them idle long.
QUEUE_FULL_RETRY_S = 5

# KEYS[1] bucket; ARGV: capacity, refill per second, tokens wanted, now (s). The bucket as it
# stands now, refilled since its last take:
_REFILLED = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
"""
# Returns {1, 0} when granted, or {0, seconds until enough tokens}.
_TAKE_TOKENS = (
    _REFILLED
    + """
if tokens >= wanted then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - wanted), 'at', tostring(now))
  redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
  return {1, '0'}
end
return {0, tostring((wanted - tokens) / rate)}
"""
)
# The same, reading only: {1, 0} when the tokens are there, else {0, seconds}.
_PEEK_TOKENS = (
    _REFILLED
    + """
if tokens >= wanted then
  return {1, '0'}
end
return {0, tostring((wanted - tokens) / rate)}
"""
)


def check_queue_room(session: Session, caller: Caller, adding: int) -> None:
    _refuse_more_than_the_limit(caller, adding)
    if not store.hold_key_until_commit(session, caller.key_id):
        raise RequestError(
            401, "the API key is not valid: it is unknown or was revoked", headers={"WWW-Authenticate": "Bearer"}
        )
    _refuse_a_full_queue(session, caller, adding)


def _refuse_more_than_the_limit(caller: Caller, adding: int) -> None:
    limit = caller.max_queued_jobs
    if limit is not None and adding > limit:
        raise RequestError(
            429,
            f"this request queues {adding} jobs but key {caller.key_id} may have at most {limit} queued: "
            "split it into smaller requests",
            headers={"Retry-After": str(QUEUE_FULL_RETRY_S)},
        )


def _refuse_a_full_queue(session: Session, caller: Caller, adding: int) -> None:
    limit = caller.max_queued_jobs
    if limit is None:
        return
    queued = store.count_queued_jobs_of_key(session, caller.key_id)
    if queued + adding > limit:
        raise RequestError(
            429,
            f"key {caller.key_id} has {queued} jobs queued and may have at most {limit}; "
            f"this request would add {adding}: retry once some have started",
            headers={"Retry-After": str(QUEUE_FULL_RETRY_S)},
        )


def take_submissions(redis: Redis, caller: Caller, count: int, now_s: float, *, spend: bool = True) -> None:
    """Spend ``count`` submissions from the key's bucket, or refuse with 429; with
    ``spend=False`` only the refusal (the bucket is left as it is)."""
    limit = caller.max_submissions_per_minute
    if limit is None:
        return
    if count > limit:
        raise RequestError(
            429,
            f"this request submits {count} jobs but key {caller.key_id} may submit at most {limit} a minute: "
            "split it into smaller requests",
            headers={"Retry-After": "60"},
        )
    try:
        script = _TAKE_TOKENS if spend else _PEEK_TOKENS
        granted, wait_s = redis.eval(script, 1, rate_limit_key(caller.key_id), limit, limit / 60.0, count, now_s)
    except RedisError as exc:
        raise queue_unavailable(exc) from None
    if not int(granted):
        retry_after = max(1, math.ceil(float(wait_s)))
        raise RequestError(
            429,
            f"key {caller.key_id} may submit {limit} jobs a minute; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )


async def precheck(db: AsyncSession, redis: Redis, caller: Caller, *, queued_jobs: int, submissions: int) -> None:
    """The 429 that ``admit`` would answer now, before the request's costly checks; spends
    nothing and holds nothing (``admit`` decides, once they have passed)."""
    _refuse_more_than_the_limit(caller, queued_jobs)
    await db.run_sync(lambda s: _refuse_a_full_queue(s, caller, queued_jobs))
    await to_thread.run_sync(lambda: take_submissions(redis, caller, submissions, time.time(), spend=False))


class _Turns:
    """A tenant's semaphore and how many requests hold or wait for it."""

    def __init__(self) -> None:
        self.semaphore = anyio.Semaphore(TOKENISING_PER_TENANT)
        self.users = 0


TOKENISING_PER_TENANT = 1  # a tenant's requests tokenising at once, per API process
# Entries live while a request holds or waits for them, so the map stays as small as the
# number of tenants tokenising right now. One map per process: the API runs one event loop.
_tokenising: dict[str, _Turns] = {}


@asynccontextmanager
async def tokenising_turn(tenant: str) -> AsyncIterator[None]:
    """Wait for this tenant's turn to tokenise (other tenants' turns are not affected)."""
    turns = _tokenising.setdefault(tenant, _Turns())
    turns.users += 1
    try:
        async with turns.semaphore:
            yield
    finally:
        turns.users -= 1
        if turns.users == 0:
            del _tokenising[tenant]


async def admit(db: AsyncSession, redis: Redis, caller: Caller, *, queued_jobs: int, submissions: int) -> None:
    """Both limits, for a request about to queue ``queued_jobs`` jobs in ``db``'s transaction."""
    await db.run_sync(lambda s: check_queue_room(s, caller, queued_jobs))
    await to_thread.run_sync(lambda: take_submissions(redis, caller, submissions, time.time()))


def admit_sync(session: Session, redis: Redis, caller: Caller, *, queued_jobs: int, submissions: int) -> None:
    """``admit`` for work that inserts its jobs through ``session`` in a worker thread: the
    key must be held by the transaction that inserts, or the insert would wait on it."""
    check_queue_room(session, caller, queued_jobs)
    take_submissions(redis, caller, submissions, time.time())
