"""Liveness and readiness, for load balancers and `docker compose` health checks."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import SessionDep, StateDep
from api.schemas.health import Health, Readiness
from gpuq import store
from gpuq.errors import RETRY_AFTER_S

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "The database or Redis does not answer"}},
)
async def readyz(db: SessionDep, state: StateDep) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        await db.run_sync(store.check_database)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {exc}"
    try:
        await to_thread.run_sync(state.redis.ping)
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unreachable: {exc}"
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ok", **checks})
    return JSONResponse(
        {"status": "unavailable", **checks}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)}
    )
