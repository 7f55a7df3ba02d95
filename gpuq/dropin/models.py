"""The registry and the fleet as Ollama's model routes list them: /api/tags, /api/show, /api/ps.

Details Ollama reads from a model's manifest (family, parameter size, quantisation) come
from the GGUF file's own metadata, through the vocabulary-only llama.cpp handle the API
already keeps per model file (no weights are read).
"""

from __future__ import annotations

from typing import Any, cast

from anyio import to_thread
from redis import Redis
from sqlalchemy.ext.asyncio import AsyncSession

from gpuq import store
from gpuq.db.tables import Model
from gpuq.dropin import ollama
from gpuq.fleet.workers import live_workers
from gpuq.jobs.prompt import vocab_tokenizer
from gpuq.redis_keys import loaded_expiry_key


def _header(model: Model) -> tuple[dict[str, str], int]:
    """The file's GGUF metadata and parameter count; none when the file cannot be read."""
    try:
        tokenizer = vocab_tokenizer(model.path)
    except ValueError:
        return {}, 0
    return tokenizer.metadata(), tokenizer.n_params()


async def embedding_length(model: Model) -> int | None:
    """The length of the model's vectors (GGUF ``<arch>.embedding_length``); None when unknown."""
    metadata, _ = await to_thread.run_sync(_header, model)
    value = metadata.get(f"{model.architecture}.embedding_length", "")
    return int(value) if value.isdigit() else None


async def tags(db: AsyncSession) -> list[dict[str, Any]]:
    models = await db.run_sync(store.list_models)
    headers = await to_thread.run_sync(lambda: [_header(m) for m in models])
    return [ollama.tag(m, *header) for m, header in zip(models, headers, strict=True)]


async def show(model: Model) -> dict[str, Any]:
    return ollama.show(model, *await to_thread.run_sync(_header, model))


def _expiries(redis: Redis, workers: list[str]) -> list[dict[bytes, bytes]]:
    with redis.pipeline(transaction=False) as pipe:
        for name in workers:
            pipe.hgetall(loaded_expiry_key(name))
        return cast(list[dict[bytes, bytes]], pipe.execute())


async def loaded(db: AsyncSession, redis: Redis, *, admin: bool) -> list[dict[str, Any]]:
    """Every model loaded on a live worker, one entry per worker holding it, the model that
    stays longest first (as Ollama orders /api/ps). Only admins see which worker and host
    hold it and when it expires (which says when some tenant last used it): submitters see
    what /v1/models shows them, the model itself."""
    workers = await to_thread.run_sync(live_workers, redis)
    expiries = await to_thread.run_sync(_expiries, redis, [w.name for w in workers])
    registry = {m.name: m for m in await db.run_sync(store.list_models)}
    entries = []
    for worker, expiry in zip(workers, expiries, strict=True):
        for name in worker.loaded_models:
            model = registry.get(name)
            if model is None:  # unregistered since it was loaded
                continue
            raw = expiry.get(name.encode(), b"").decode()
            header = await to_thread.run_sync(_header, model)
            entries.append(
                ollama.running(
                    model, *header, worker=worker.name, host=worker.host, expires_at=float(raw) if raw else None
                )
            )
    entries.sort(key=lambda e: e["expires_at"] or "9999", reverse=True)
    if admin:
        return entries
    hidden = ("worker", "host", "expires_at")
    shown = [{k: v for k, v in e.items() if k not in hidden} | {"expires_at": None} for e in entries]
    return list({e["name"]: e for e in shown}.values())  # one entry per model, not per worker
