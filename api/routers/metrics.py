"""GET /metrics: Prometheus text exposition (format 0.0.4), for admins' scrapers.

Counters and histograms live in Redis (written where the events happen, see
``gpuq/stats/metrics.py``), so every API process renders the same cumulative figures; gauges
are read now. Scrape with an admin key: ``authorization: {credentials: <key>}`` in the
Prometheus job. With Redis down the scrape still answers, with ``gpuq_redis_up 0`` and what
SQL knows; with the database down it cannot check the key, and fails.
"""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Response
from redis.exceptions import RedisError

from api.deps import ADMIN_ONLY, SessionDep, StateDep
from api.errors import errors
from gpuq import store
from gpuq.db.tables import JobKind
from gpuq.stats import metrics
from gpuq.stats.backlog import NOTHING, queued_tokens

router = APIRouter(tags=["metrics"], dependencies=ADMIN_ONLY, responses=errors(403))


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {metrics.CONTENT_TYPE: {"schema": {"type": "string"}}}, "description": "Prometheus text"}
    },
)
async def prometheus_metrics(db: SessionDep, state: StateDep) -> Response:
    models = await db.run_sync(store.list_models)
    gpus = await db.run_sync(store.list_gpus)
    # Queue depth for every registered model's kinds (and its noop probes), zeros included,
    # so a queue that drains shows 0 rather than vanishing.
    queues = [(m.name, kind) for m in models for kind in [*m.kinds, JobKind.NOOP.value]]
    try:
        snapshot = await to_thread.run_sync(lambda: metrics.read_snapshot(state.redis, queues=queues, gpus=gpus))
    except RedisError:
        snapshot = metrics.Snapshot.without_redis(gpus)
    fronts = [job for jobs in snapshot.queue_front.values() for job in jobs]
    created = await db.run_sync(lambda s: store.creation_times(s, fronts)) if fronts else {}
    # Every registered model's work waiting, zeros included (a drained queue reads 0), and that
    # of any other model jobs still wait for.
    backlog = {m.name: NOTHING for m in models} | await db.run_sync(queued_tokens)
    return Response(metrics.render(snapshot, created=created, backlog=backlog), media_type=metrics.CONTENT_TYPE)
