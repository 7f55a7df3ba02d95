"""/v1/keys: API keys. Admins create, list, reweigh and revoke them; any key may ask who it is."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Response, status
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from api.deps import AdminDep, AppState, CallerDep, SessionDep, StateDep
from api.errors import errors
from api.schemas import KeyCreate, KeyCreated, KeyListed, KeyPublic, KeysPublic, KeyUpdate
from gpuq import store
from gpuq.db.tables import utcnow
from gpuq.errors import RequestError
from gpuq.jobs import fair
from gpuq.jobs.actions import cancel_jobs_of_key

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated, responses=errors(403, 409))
async def create_key(body: KeyCreate, db: SessionDep, state: StateDep, _admin: AdminDep) -> KeyCreated:
    """The response holds the secret; gpuq keeps only its hash and cannot show it again. A
    name the owner's active keys already use is a 409: names are how keys are told apart."""
    same = await db.run_sync(lambda s: store.active_key_named(s, owner=body.owner, name=body.name))
    if same is not None:
        raise RequestError(
            409,
            f"{body.owner} already has an active key named {body.name!r} ({same.id}): choose another name, "
            "or revoke that key first",
            param="name",
        )
    key, secret = await db.run_sync(
        lambda s: store.create_api_key(
            s,
            name=body.name,
            owner=body.owner,
            role=body.role,
            max_queued_jobs=body.max_queued_jobs,
            max_submissions_per_minute=body.max_submissions_per_minute,
            default_priority=body.default_priority,
            weight=body.weight,
        )
    )
    await _sync_weights(db, state)
    return KeyCreated(**KeyPublic.of(key).model_dump(), key=secret)


async def _sync_weights(db: AsyncSession, state: AppState) -> None:
    """The tenants' weights to Redis now, where the fair pick reads them; with Redis down the
    reconciler's next pass does it (SQL holds them)."""
    weights = await db.run_sync(store.tenant_weights)
    try:
        await to_thread.run_sync(lambda: fair.set_weights(state.redis, fair.weights_by_tenant(weights)))
    except RedisError:
        log.warning("could not write the tenants' weights to Redis; the reconciler will", exc_info=True)


@router.patch("/{key_id}", response_model=KeyPublic, responses=errors(403, 404))
async def update_key(key_id: str, body: KeyUpdate, db: SessionDep, state: StateDep, _admin: AdminDep) -> KeyPublic:
    """Change an active key's weight: its tenant's share of the fleet beside other tenants'
    jobs of the same priority, from the next job a worker takes."""
    key = await db.run_sync(lambda s: store.set_key_weight(s, key_id, body.weight))
    if key is None:
        raise RequestError(404, f"key {key_id!r} does not exist or is revoked")
    await _sync_weights(db, state)
    return KeyPublic.of(key)


@router.get("", response_model=KeysPublic, responses=errors(403))
async def list_keys(db: SessionDep, _admin: AdminDep, include_revoked: Annotated[bool, Query()] = False) -> KeysPublic:
    """Every key with what it submitted in the past hour (the dashboard's keys page)."""
    keys, usage = await db.run_sync(
        lambda s: (
            store.list_api_keys(s, include_revoked=include_revoked),
            store.usage_by_key_since(s, utcnow() - timedelta(hours=1)),
        )
    )
    none = store.KeyUsage()
    return KeysPublic(
        data=[
            KeyListed(
                **KeyPublic.of(k).model_dump(),
                jobs_last_hour=usage.get(k.id, none).jobs,
                tokens_last_hour=usage.get(k.id, none).tokens,
            )
            for k in keys
        ]
    )


@router.get("/me", response_model=KeyPublic)
async def who_am_i(db: SessionDep, caller: CallerDep) -> KeyPublic:
    """The calling key: its tenant, role and limits."""
    key = await db.run_sync(store.get_api_key, caller.key_id)
    assert key is not None  # it authenticated this very request
    return KeyPublic.of(key)


@router.delete("/{key_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404, 409, 503))
async def revoke_key(
    key_id: str,
    db: SessionDep,
    state: StateDep,
    _admin: AdminDep,
    cancel_jobs: Annotated[
        bool,
        Query(
            description="also cancel every queued or running job the key submitted (its batches' too); "
            "allowed on a key revoked earlier"
        ),
    ] = False,
) -> Response:
    """The key stops working at once: every request after this one is a 401. Work it
    submitted before runs on, open streams included, unless `cancel_jobs` (docs/security.md).
    The last active admin key cannot be revoked: that would lock every admin out (create
    another admin key first)."""
    outcome = await db.run_sync(store.revoke_key_keeping_an_admin, key_id)
    if outcome == store.Revocation.LAST_ADMIN:
        raise RequestError(409, f"key {key_id} is the last active admin key; create another admin key first")
    if outcome == store.Revocation.NOT_FOUND:
        revoked_earlier = cancel_jobs and await db.run_sync(lambda s: store.get_api_key(s, key_id)) is not None
        if not revoked_earlier:
            raise RequestError(404, f"key {key_id!r} does not exist or is already revoked")
    if cancel_jobs:
        await cancel_jobs_of_key(db, state.redis, key_id)
    await _sync_weights(db, state)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
