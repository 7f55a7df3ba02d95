"""What routes depend on, as ``Annotated`` aliases: the app's state, a database session, Redis,
the caller; and the one check that a caller may see a job, a batch or a file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Protocol, TypeVar

from anyio import to_thread
from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from api.schemas.common import MAX_SQL_INT
from gpuq import store
from gpuq.auth.access import Caller
from gpuq.batches.destinations import DestinationPolicy, check_webhook_url
from gpuq.db.tables import Batch, File, Job
from gpuq.errors import RequestError
from gpuq.jobs.prefix_routing import PrefixRouting, routing_of
from gpuq.settings import Settings


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    redis: Redis
    # Heavy synchronous work (starting a 50,000-line batch) runs in a worker thread with
    # its own session, off the event loop.
    sync_sessions: sessionmaker[Session]
    destinations: DestinationPolicy  # where webhook_url may point (gpuq/batches/destinations.py)
    # Interactive calls wait on their jobs' token streams here: a blocked XREAD holds one
    # connection of this pool, and no thread (gpuq/streams/follow.py).
    streams: AsyncRedis
    # The jobs of the interactive calls this process is answering: when it stops, those not
    # yet started are cancelled and their calls answered (gpuq/dropin/shutdown.py).
    calls: set[str] = field(default_factory=set)

    @property
    def routing(self) -> PrefixRouting:
        """Prefix-aware placement as the settings have it (``gpuq.jobs.prefix_routing``)."""
        return routing_of(self.settings)

    async def check_webhook_url(self, url: object | None) -> None:
        """A 422 for a webhook URL that may not be sent to; the lookup runs off the event loop."""
        if url is not None:
            await to_thread.run_sync(lambda: check_webhook_url(self.destinations, str(url)))


def get_state(request: Request) -> AppState:
    return request.app.state.gpuq


async def get_db(state: Annotated[AppState, Depends(get_state)]) -> AsyncIterator[AsyncSession]:
    async with state.sessions() as session:
        yield session


StateDep = Annotated[AppState, Depends(get_state)]
# The id of a row with an integer key (a schedule, an affinity rule), as a path parameter:
# one beyond what the column holds is a 422, not a database error.
RowId = Annotated[int, Path(ge=1, le=MAX_SQL_INT)]
SessionDep = Annotated[AsyncSession, Depends(get_db)]


# Reads ``Authorization: Bearer <key>``; as a dependency it also marks each route that needs
# a key with the bearer security scheme in the OpenAPI document. Its own refusal (a bare
# 403) is off: get_caller answers 401 in gpuq's shape.
_bearer = HTTPBearer(scheme_name="apiKey", description="a gpuq API key (`gpuq keys create`)", auto_error=False)
# ... or ``x-api-key: <key>``, the header the anthropic SDK (and Claude Code) sends. Taken on
# every route, not only Anthropic's: the SDK sends it to whatever it calls (GET /v1/models
# too), it is the same key either way, and one rule is simpler to document and to audit.
# Listed as a second scheme, so the OpenAPI document offers either.
_x_api_key = APIKeyHeader(
    name="x-api-key",
    scheme_name="xApiKey",
    description="a gpuq API key, as the anthropic SDK sends it",
    auto_error=False,
)


async def get_caller(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    x_api_key: Annotated[str | None, Depends(_x_api_key)],
    db: SessionDep,
) -> Caller:
    """The caller's API key, from ``Authorization: Bearer <key>`` (what the OpenAI client
    sends) or ``x-api-key: <key>`` (the anthropic SDK); the bearer token when both are sent."""
    secret = credentials.credentials.strip() if credentials is not None else ""
    secret = secret or (x_api_key or "").strip()
    if not secret:
        raise RequestError(
            401,
            "this endpoint needs an API key: send the header `Authorization: Bearer <key>` or `x-api-key: <key>` "
            "(an admin creates keys with `gpuq keys create` or POST /v1/keys)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = await db.run_sync(store.find_active_key, secret)
    if key is None:
        raise RequestError(
            401, "the API key is not valid: it is unknown or was revoked", headers={"WWW-Authenticate": "Bearer"}
        )
    return Caller.of(key)


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_admin(caller: CallerDep) -> Caller:
    caller.require_admin()
    return caller


AdminDep = Annotated[Caller, Depends(get_admin)]
# For routers whose every route is for admins: APIRouter(dependencies=ADMIN_ONLY).
ADMIN_ONLY = [Depends(get_admin)]
# For routers whose every route needs some valid key.
KEY_REQUIRED = [Depends(get_caller)]


class Owned(Protocol):
    @property
    def owner(self) -> str | None: ...


Row = TypeVar("Row", bound=Owned)


async def visible_or_404(
    db: AsyncSession, caller: Caller, read: Callable[[Session, str], Row | None], row_id: str, noun: str
) -> Row:
    """The row if the caller's tenant may see it. Another tenant's row answers the same 404
    as a missing one, so ids cannot be probed across tenants."""
    found = await db.run_sync(read, row_id)
    if found is None or not caller.may_see(found.owner):
        raise RequestError(404, f"{noun} {row_id!r} does not exist")
    return found


async def visible_job(db: AsyncSession, caller: Caller, job_id: str) -> Job:
    return await visible_or_404(db, caller, store.get_job, job_id, "job")


async def visible_file(db: AsyncSession, caller: Caller, file_id: str) -> File:
    return await visible_or_404(db, caller, store.get_file, file_id, "file")


async def visible_batch(db: AsyncSession, caller: Caller, batch_id: str) -> Batch:
    db.expire_all()  # a batch moves on in other sessions (its start thread, the scheduler): read it afresh
    return await visible_or_404(db, caller, store.get_batch, batch_id, "batch")
