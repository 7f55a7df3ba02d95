"""GET /metrics: Prometheus text exposition (format 0.0.4), for admins' scrapers.

Counters and histograms live in Redis (written where the events happen, see
``gpuq/metrics.py``), so every API process renders the same cumulative figures; gauges are
read now. Scrape with an admin key: ``authorization: {credentials: <key>}`` in the
Prometheus job.
"""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Response

from api.deps import ADMIN_ONLY, SessionDep, StateDep
from api.errors import errors
from gpuq import store
from gpuq.db.tables import JobKind
from gpuq.stats import metrics

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
    snapshot = await to_thread.run_sync(lambda: metrics.read_snapshot(state.redis, queues=queues, gpus=gpus))
    return Response(metrics.render(snapshot), media_type=metrics.CONTENT_TYPE)
