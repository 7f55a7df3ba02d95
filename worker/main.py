"""Wiring a worker process together from settings, and running it until it is told to stop."""

from __future__ import annotations

import logging
import os
import secrets
import socket

from redis import Redis

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet.gpus import nvml_inventory
from gpuq.settings import Settings
from gpuq.stats import metrics
from gpuq.streams.publish import StreamPublisher
from worker.catalog import ModelCatalog
from worker.device import detect_device
from worker.energy import energy_meter_for
from worker.engine import LoadedModel
from worker.faults import GpuHealth, hand_back_to_queue, too_small_models
from worker.model_cache import ModelCache, ModelSpec
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner
from worker.worker import GpuqWorker

log = logging.getLogger(__name__)


def worker_name(slot: str) -> str:
    return f"{socket.gethostname()}.{slot}.{os.getpid()}.{secrets.token_hex(2)}"


def run_worker(settings: Settings, *, slot: str = "cpu", models: list[str] | None = None, burst: bool = False) -> None:
    device = detect_device()
    redis = Redis.from_url(settings.require_redis_url())
    sessions = sync_sessions(sync_engine(settings.database_url))

    def load(spec: ModelSpec) -> LoadedModel:
        return LoadedModel(
            spec.path,
            n_ctx=spec.n_ctx,
            embedding=spec.embedding,
            threads=settings.llama_threads,
            gpu_layers=device.gpu_layers,
            tensor_split=tensor_split(),
            slots=settings.slots_for(on_gpu=device.on_gpu),
            prompt_cache=settings.worker_prompt_cache,
        )

    def tensor_split() -> list[float] | None:
        """For a GPU group: proportional to each GPU's free memory now (NVML), so each
        holds its share; total memory when NVML cannot say."""
        slot = catalog.slot
        if slot is None or len(slot.targets) < 2 or not device.on_gpu:
            return None
        live = nvml_inventory(socket.gethostname())
        return [
            float(gpu.memory_free_mib if live and (gpu := live.by_uuid(t.uuid)) else t.memory_total_mib)
            for t in slot.targets
        ]

    catalog = ModelCatalog(
        sessions, gpu_uuids=device.gpu_uuids, only=models, too_small=lambda: too_small_models(redis, device.gpu_uuids)
    )
    catalog.refresh()
    budget = catalog.slot.memory_total_mib if catalog.slot is not None and catalog.slot.memory_total_mib else None
    cache = ModelCache(
        load,
        max_loaded=settings.worker_max_loaded_models,
        budget_mib=budget,
        on_load=lambda spec, seconds: metrics.record_model_load(redis, spec.name, seconds),
    )
    streams = StreamPublisher(redis)  # token streams of interactive calls (OpenAI's and Ollama's APIs)
    writer = OutcomeWriter(sessions, redis=redis, streams=streams)
    name = worker_name(slot)

    def mark_unhealthy(reason: str) -> None:
        with sessions() as session:
            for uuid in device.gpu_uuids:
                store.set_gpu_health(session, uuid, healthy=False, reason=reason)

    runner = JobRunner(
        sessions=sessions,
        models=catalog.get,
        cache=cache,
        writer=writer,
        worker_name=name,
        device=device.label,
        host=settings.host,
        gpu_uuids=device.gpu_uuids,
        default_keep_alive_s=settings.worker_keep_alive_s,
        on_gpu=device.on_gpu,
        hand_back=hand_back_to_queue(
            sessions, redis, worker=name, gpu_uuids=device.gpu_uuids, timeout_s=settings.job_timeout_s
        ),
        health=GpuHealth(mark_unhealthy) if device.on_gpu else None,
        energy=energy_meter_for(device, sample_interval_s=settings.energy_sample_interval_s),
        streams=streams,
    )
    worker = GpuqWorker(
        runner=runner,
        list_servable=catalog.refresh,
        loaded_models=cache.loaded_names,
        model_expiries=cache.expiries,
        on_idle=cache.unload_expired,
        unload_model=cache.unload,  # an admin's unload (POST /v1/models/{name}/unload)
        flush_outcomes=writer.flush,
        worker_ttl_s=settings.worker_ttl_s,
        heartbeat_interval_s=settings.worker_heartbeat_interval_s,
        queue_refresh_interval_s=settings.worker_refresh_interval_s,
        job_timeout_s=settings.job_timeout_s,
        slots=settings.slots_for(on_gpu=device.on_gpu),
        connection=redis,
    )
    log.info(
        "worker %s on %s (VRAM budget %s MiB), %d llama.cpp threads",
        runner.worker_name,
        device.label,
        budget,
        settings.llama_threads,
    )
    writer.start()
    try:
        worker.work(burst=burst, logging_level="INFO")
    finally:
        writer.stop()
        cache.clear()
