"""What routes depend on, as ``Annotated`` aliases: the app's state, a database session, Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

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


def get_state(request: Request) -> AppState:
    return request.app.state.gpuq  # type: ignore[no-any-return]


async def get_db(state: Annotated[AppState, Depends(get_state)]) -> AsyncIterator[AsyncSession]:
    async with state.sessions() as session:
        yield session


StateDep = Annotated[AppState, Depends(get_state)]
SessionDep = Annotated[AsyncSession, Depends(get_db)]
