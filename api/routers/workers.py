"""/v1/workers and /v1/hosts: the live workers, draining and undraining them (one, or a
whole host), and unloading models (also /v1/models/{name}/unload). Admins only. Each drain
and undrain is recorded as an event (/v1/events).

The state lives in Redis (see gpuq/fleet/workers.py), slots and slots busy included; the
jobs each worker runs come from SQL, the system of record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from anyio import to_thread
from fastapi import APIRouter

from api.deps import ADMIN_ONLY, AdminDep, SessionDep, StateDep
from api.errors import errors
from api.schemas.workers import HostDrain, UnloadRequest, UnloadRequested, WorkerPublic, WorkersPublic
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.db.tables import EventKind
from gpuq.errors import RequestError
from gpuq.fleet import workers
from gpuq.fleet.workers import LiveWorker

router = APIRouter(tags=["workers"], dependencies=ADMIN_ONLY, responses=errors(403))


async def _running_by_worker(db: SessionDep) -> dict[str, list[str]]:
    """Job ids running on each worker, by submission (ids begin with their submission time)."""
    running: dict[str, list[str]] = defaultdict(list)
    for r in sorted(await db.run_sync(store.running_jobs), key=lambda r: r.entry.job_id):
        if r.worker:
            running[r.worker].append(r.entry.job_id)
    return running


async def _views(db: SessionDep, state: StateDep, *, host: str | None = None) -> list[WorkerPublic]:
    live = await to_thread.run_sync(lambda: workers.live_workers(state.redis))
    running = await _running_by_worker(db)
    restarts = await db.run_sync(store.restarts_by_slot)
    return [
        WorkerPublic.of(w, running.get(w.name, []), restarts.get((w.host, w.slot), 0))
        for w in live
        if host is None or w.host == host
    ]


async def _record_drain(db: SessionDep, caller: Caller, drained: bool, *, host: str, worker: LiveWorker | None) -> None:
    """A drain or undrain as an event (``GET /v1/events``): of one worker, or of a whole host."""
    kind = EventKind.DRAINED if drained else EventKind.UNDRAINED
    event = store.NewEvent(kind, host=host, detail=f"by admin key {caller.key_id}" + ("" if worker else ", host-wide"))
    if worker is not None:
        event = replace(event, slot=worker.slot, worker=store.worker_identity(worker.name), gpu_uuids=worker.gpu_uuids)
    await db.run_sync(lambda s: store.record_events(s, [event]))


async def _live(state: StateDep, name: str) -> workers.LiveWorker:
    found = await to_thread.run_sync(lambda: workers.find_worker(state.redis, name))
    if found is None:
        raise RequestError(404, f"worker {name!r} is not alive (see GET /v1/workers for the live ones)")
    return found


@router.get("/v1/workers", response_model=WorkersPublic)
async def list_workers(db: SessionDep, state: StateDep) -> WorkersPublic:
    hosts = await to_thread.run_sync(lambda: workers.drained_hosts(state.redis))
    return WorkersPublic(data=await _views(db, state), drained_hosts=sorted(hosts))


@router.get("/v1/workers/{name}", response_model=WorkerPublic, responses=errors(404))
async def read_worker(name: str, db: SessionDep, state: StateDep) -> WorkerPublic:
    worker = await _live(state, name)
    restarts = (await db.run_sync(store.restarts_by_slot)).get((worker.host, worker.slot), 0)
    return WorkerPublic.of(worker, (await _running_by_worker(db)).get(name, []), restarts)


async def _drain_worker(name: str, db: SessionDep, state: StateDep, caller: Caller, *, drained: bool) -> WorkerPublic:
    worker = await _live(state, name)
    if not await to_thread.run_sync(lambda: workers.set_worker_drain(state.redis, name, drained=drained)):
        raise RequestError(404, f"worker {name!r} stopped while being {'drained' if drained else 'undrained'}")
    await _record_drain(db, caller, drained, host=worker.host, worker=worker)
    return await read_worker(name, db, state)


@router.post("/v1/workers/{name}/drain", response_model=WorkerPublic, responses=errors(404))
async def drain_worker(name: str, db: SessionDep, state: StateDep, caller: AdminDep) -> WorkerPublic:
    """The worker finishes its running jobs and takes no more until undrained (state
    `draining`, then `drained`); it stays alive. The flag lives as long as the process."""
    return await _drain_worker(name, db, state, caller, drained=True)


@router.post("/v1/workers/{name}/undrain", response_model=WorkerPublic, responses=errors(404))
async def undrain_worker(name: str, db: SessionDep, state: StateDep, caller: AdminDep) -> WorkerPublic:
    """Clears the worker's own flag; a worker whose host is drained stays drained (`drained_by`)."""
    return await _drain_worker(name, db, state, caller, drained=False)


async def _drain_host(host: str, db: SessionDep, state: StateDep, caller: Caller, *, drained: bool) -> HostDrain:
    live = await to_thread.run_sync(lambda: workers.live_workers(state.redis))
    known = {w.host for w in live} | {g.host for g in await db.run_sync(store.list_gpus)}
    known |= await to_thread.run_sync(lambda: workers.drained_hosts(state.redis))
    if host not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise RequestError(404, f"host {host!r} has no live worker and no GPU on record (known hosts: {listed})")
    names = [w.name for w in live if w.host == host]
    changed = await to_thread.run_sync(lambda: workers.set_host_drain(state.redis, host, names, drained=drained))
    if changed:
        await _record_drain(db, caller, drained, host=host, worker=None)
    return HostDrain(host=host, drained=drained, changed=changed, workers=await _views(db, state, host=host))


@router.post("/v1/hosts/{host}/drain", response_model=HostDrain, responses=errors(404))
async def drain_host(host: str, db: SessionDep, state: StateDep, caller: AdminDep) -> HostDrain:
    """Every worker of the host, including workers started there later, until undrained."""
    return await _drain_host(host, db, state, caller, drained=True)


@router.post("/v1/hosts/{host}/undrain", response_model=HostDrain, responses=errors(404))
async def undrain_host(host: str, db: SessionDep, state: StateDep, caller: AdminDep) -> HostDrain:
    return await _drain_host(host, db, state, caller, drained=False)


@router.post("/v1/workers/{name}/unload", response_model=UnloadRequested, responses=errors(404, 409))
async def unload_on_worker(name: str, body: UnloadRequest, state: StateDep) -> UnloadRequested:
    """Unload a model from one worker: at once if it is idle, else right after its job."""
    worker = await _live(state, name)
    if body.model not in worker.loaded_models:
        held = ", ".join(worker.loaded_models) or "nothing"
        raise RequestError(409, f"worker {name} does not hold model {body.model!r}; it holds {held}")
    await to_thread.run_sync(lambda: workers.request_unload(state.redis, [name], body.model))
    return UnloadRequested(model=body.model, workers=[name])


@router.post("/v1/models/{name}/unload", response_model=UnloadRequested, responses=errors(404))
async def unload_everywhere(name: str, db: SessionDep, state: StateDep) -> UnloadRequested:
    """Every worker holding the model unloads it (at once if idle, else after its job). The
    next job for it loads it again: this frees memory, it does not retire the model."""
    if await db.run_sync(store.get_model, name) is None:
        raise RequestError(404, f"model {name!r} is not registered (see GET /v1/models)")
    live = await to_thread.run_sync(lambda: workers.live_workers(state.redis))
    holders = [w.name for w in live if name in w.loaded_models]
    if holders:
        await to_thread.run_sync(lambda: workers.request_unload(state.redis, holders, name))
    return UnloadRequested(model=name, workers=holders)
