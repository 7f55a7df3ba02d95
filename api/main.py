"""The FastAPI application: routers assembled here, state opened and closed with the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from api.body_limit import BodyLimitMiddleware
from api.deps import AppState
from api.errors import install_error_handlers
from api.input_guard import refuse_unstorable_input
from api.json_bodies import JsonBodiesMiddleware
from api.large_bodies import LargeBodyTurnsMiddleware
from api.openapi import install_openapi
from api.routers import (
    affinity,
    anthropic,
    batches,
    dashboard,
    events,
    files,
    gpus,
    health,
    job_actions,
    jobs,
    keys,
    metrics,
    model_aliases,
    models,
    ollama,
    openai,
    responses,
    schedules,
    stats,
    tokenizer,
    webhooks,
    workers,
)
from gpuq.batches.destinations import DestinationPolicy, Resolve, system_resolve
from gpuq.batches.files import files_dir, remove_stale_uploads
from gpuq.db.engine import async_engine, async_sessions, sync_engine, sync_sessions
from gpuq.llama_log import route_llama_log
from gpuq.private_files import warn_if_open_to_others
from gpuq.settings import Settings, get_settings


def create_app(settings: Settings | None = None, *, resolve: Resolve = system_resolve) -> FastAPI:
    """The app over ``settings``; ``resolve`` is how webhook hosts are looked up (tests stub it)."""
    settings = settings or get_settings()
    destinations = DestinationPolicy.from_setting(settings.webhook_allowed_hosts, resolve=resolve)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warn_if_open_to_others(settings.data_dir)
        route_llama_log()  # the prompt tokenizer loads llama.cpp (vocab only): its log through Python logging
        remove_stale_uploads(files_dir(settings.data_dir))  # left by an API killed mid-upload
        engine = async_engine(settings.database_url)
        blocking_engine = sync_engine(settings.database_url)
        redis = Redis.from_url(settings.require_redis_url(), socket_timeout=30, socket_connect_timeout=5)
        streams = AsyncRedis.from_url(settings.require_redis_url(), socket_timeout=30, socket_connect_timeout=5)
        app.state.gpuq = AppState(
            settings, engine, async_sessions(engine), redis, sync_sessions(blocking_engine), destinations, streams
        )
        try:
            yield
        finally:
            await streams.aclose()
            redis.close()
            await engine.dispose()
            blocking_engine.dispose()

    app = FastAPI(title="gpuq", version="0.1.0", lifespan=lifespan, dependencies=[Depends(refuse_unstorable_input)])
    app.add_middleware(LargeBodyTurnsMiddleware, upload_prefix="/v1/files")  # inside the size limit
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        upload_max_bytes=settings.max_upload_bytes,
        upload_prefix=("/v1/files", "/v1/messages/batches"),
    )
    app.add_middleware(JsonBodiesMiddleware, upload_prefix="/v1/files")
    install_error_handlers(app)
    routers = (
        health.router,
        jobs.router,
        openai.router,
        anthropic.router,
        responses.router,
        ollama.router,
        tokenizer.router,
        stats.router,
        job_actions.router,
        workers.router,
        events.router,
        models.router,
        gpus.router,
        affinity.router,
        files.router,
        batches.router,
        schedules.router,
        webhooks.router,
        keys.router,
        dashboard.router,
        metrics.router,
        model_aliases.router,
    )
    for router in routers:
        app.include_router(router)
    install_openapi(app)
    return app
