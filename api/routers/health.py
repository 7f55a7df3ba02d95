"""Liveness and readiness, for load balancers and `docker compose` health checks."""

from __future__ import annotations

import shutil
from pathlib import Path

from anyio import to_thread
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import SessionDep, StateDep
from api.schemas.health import Health, Readiness
from gpuq import store
from gpuq.errors import RETRY_AFTER_S
from gpuq.fleet.workers import LiveWorker, live_workers

router = APIRouter(tags=["health"])

# Below this the data directory counts as full: uploads, output files and SQLite writes fail.
MIN_FREE_BYTES = 1024 * 1024


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "The database or Redis does not answer, or the data directory's disk is full",
        }
    },
)
async def readyz(db: SessionDep, state: StateDep) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        await db.run_sync(store.check_database)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {exc}"
    checks["disk"] = await to_thread.run_sync(_disk, state.settings.data_dir)
    workers = "unknown"
    try:
        workers = _workers(await to_thread.run_sync(live_workers, state.redis))
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unreachable: {exc}"
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ok", **checks, "workers": workers})
    return JSONResponse(
        {"status": "unavailable", **checks, "workers": workers},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _disk(data_dir: Path) -> str:
    """ "ok", or "full: ..." when less than ``MIN_FREE_BYTES`` is left where the data directory is."""
    where = next((p for p in (data_dir, *data_dir.resolve().parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(where).free
    if free >= MIN_FREE_BYTES:
        return "ok"
    return f"full: {free} bytes free under {data_dir}; uploads and writes there fail until space is freed"


def _workers(live: list[LiveWorker]) -> str:
    """Whether any worker can take a job now: a supervisor that died, or every worker drained,
    leaves the API accepting jobs that nothing runs."""
    taking = sum(1 for worker in live if not worker.drain_requested)
    if taking:
        return f"{taking} can take jobs"
    if live:
        return f"none can take jobs: all {len(live)} live workers are drained"
    return "none can take jobs: no live worker"
