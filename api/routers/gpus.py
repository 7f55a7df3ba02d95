"""/v1/gpus: the fleet's GPUs (inventory from SQL, live telemetry from Redis)."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter

from api.deps import ADMIN_ONLY, SessionDep, StateDep
from api.errors import errors
from api.schemas import GpuPublic, GpusPublic
from gpuq import store
from gpuq.errors import RequestError
from gpuq.fleet import health, telemetry

router = APIRouter(prefix="/v1/gpus", tags=["gpus"], dependencies=ADMIN_ONLY, responses=errors(403))


@router.get("", response_model=GpusPublic)
async def list_gpus(db: SessionDep, state: StateDep) -> GpusPublic:
    gpus = await db.run_sync(store.list_gpus)
    live = await to_thread.run_sync(lambda: telemetry.read(state.redis, [g.uuid for g in gpus]))
    too_small = await to_thread.run_sync(lambda: {g.uuid: health.too_small_models(state.redis, [g.uuid]) for g in gpus})
    return GpusPublic(
        data=[
            GpuPublic(
                uuid=g.uuid,
                host=g.host,
                index=g.index,
                name=g.name,
                simulated=g.simulated,
                memory_total_mib=g.memory_total_mib,
                healthy=g.healthy,
                unhealthy_reason=g.unhealthy_reason,
                too_small_for=sorted(too_small[g.uuid]),
                last_seen=g.last_seen,
                live=g.uuid in live,
                memory_free_mib=live.get(g.uuid, {}).get("memory_free_mib"),
                utilisation_pct=live.get(g.uuid, {}).get("utilisation_pct"),
                temperature_c=live.get(g.uuid, {}).get("temperature_c"),
                power_w=live.get(g.uuid, {}).get("power_w"),
            )
            for g in gpus
        ]
    )


@router.post("/{uuid}/clear", response_model=dict[str, str], responses=errors(404))
async def clear_unhealthy(uuid: str, db: SessionDep, state: StateDep) -> dict[str, str]:
    """Mark a GPU healthy again after an admin has looked at it (and forget the models it was
    found too small for)."""
    if not await db.run_sync(lambda s: health.clear(s, state.redis, uuid)):
        raise RequestError(404, f"GPU {uuid!r} is not in the inventory")
    return {"uuid": uuid, "status": "healthy"}
