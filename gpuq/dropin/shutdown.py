"""An API that stops while interactive calls wait in the queue answers them.

Its server waits for every open connection before it exits, and a call follows its job
until the job ends; a queued job may never start once its workers stop too (Ctrl-C reaches
every process of ``gpuq up``). So a stopping API cancels the jobs of the calls it is
answering that have not started, saying why; each call then ends with that answer at its
follower's next look at the job's row, and the server can exit. Calls whose jobs run go on:
their workers finish them (a drain lets running jobs finish).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from anyio import to_thread
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuq import store
from gpuq.jobs.enqueue import remove_queued

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down and this call's job had not started: send the request again later"


async def cancel_waiting_calls(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, job_ids: Collection[str]
) -> list[str]:
    """The jobs among ``job_ids`` still queued, cancelled with ``SHUTTING_DOWN``; their ids."""
    async with sessions() as db:
        cancelled = await db.run_sync(lambda s: store.cancel_queued_jobs_saying(s, list(job_ids), error=SHUTTING_DOWN))
    if cancelled:
        log.warning("shutting down: cancelled %d call(s) whose jobs had not started", len(cancelled))
        try:  # Redis may be stopping too: a cancelled row is never claimed anyway
            await to_thread.run_sync(lambda: remove_queued(redis, cancelled))
        except RedisError:
            log.info("could not take the cancelled calls' jobs out of Redis; their claims will find them cancelled")
    return [entry.job_id for entry in cancelled]
