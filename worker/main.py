"""Wiring a worker process together from settings, and running it until it is told to stop.

A worker starts only once the database and Redis both answer (it waits for them); a start
that fails all the same because one of them went away exits with ``EXIT_OUTAGE``, which the
supervisor restarts without holding it against the GPU (``worker/outages.py``). One whose
loop stops on an error of its own exits with ``EXIT_DEFECT``, never 0 (``worker/exits.py``)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet import health
from gpuq.jobs import outcome_spool
from gpuq.llama_log import route_llama_log
from gpuq.settings import Settings
from gpuq.stats import metrics
from gpuq.streams.publish import StreamPublisher
from worker.catalog import ModelCatalog, Slot
from worker.device import Device, DeviceUnusable, detect_device
from worker.energy import energy_meter_for
from worker.engine import LoadedModel
from worker.exits import EXIT_DEFECT, EXIT_DEVICE_UNUSABLE, EXIT_OUTAGE
from worker.faults import GpuHealth, StepBack, hand_back_to_queue, send_back_to_queue
from worker.gpu_memory import GpuMemory
from worker.model_cache import ModelCache, ModelSpec
from worker.outages import is_outage, wait_for_dependencies
from worker.outcome_writer import OutcomeWriter
from worker.prefix_cache import PrefixCache, mem_available_bytes, ram_limit_bytes
from worker.prefix_index import held_hashes
from worker.runner import JobRunner
from worker.worker import GpuqWorker

log = logging.getLogger(__name__)


def worker_name(slot: str) -> str:
    return f"{socket.gethostname()}.{slot}.{os.getpid()}.{secrets.token_hex(2)}"


def device_or_refuse(settings: Settings, sessions: sessionmaker[Session]) -> Device:
    """The device this worker runs on. A worker pinned to GPUs it cannot use marks them
    unhealthy with the reason and exits (``EXIT_DEVICE_UNUSABLE``), never running on the CPU."""
    try:
        return detect_device(check_offload=settings.worker_offload_check)
    except DeviceUnusable as exc:
        log.error("refusing to start on %s: %s", ",".join(exc.gpu_uuids), exc)
        health.mark_unhealthy(sessions, exc.gpu_uuids, f"a worker could not run on it: {exc}")
        raise SystemExit(EXIT_DEVICE_UNUSABLE) from None


def run_worker(
    settings: Settings,
    *,
    slot: str = "cpu",
    models: list[str] | None = None,
    burst: bool = False,
    gpu_share: int = 1,
) -> None:
    """One worker until it is told to stop; ``gpu_share`` workers share its GPUs (each budgets
    that share of their memory)."""
    route_llama_log()  # before llama.cpp loads anything: its log through Python logging
    sessions = sync_sessions(sync_engine(settings.database_url))
    redis = Redis.from_url(settings.require_redis_url())
    wait_for_dependencies(sessions, redis)
    try:
        _run_worker(settings, sessions, redis, slot=slot, models=models, burst=burst, gpu_share=gpu_share)
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.error("Redis or the database went away while this worker started or ran; exiting to be restarted: %s", exc)
        raise SystemExit(EXIT_OUTAGE) from None


def _write_spooled_outcomes(sessions: sessionmaker[Session], redis: Redis, spools: Path) -> None:
    """Outcomes that workers of this machine spooled to files while the database and Redis
    were both down, and that died before writing them (``gpuq.jobs.outcome_spool``)."""
    with sessions() as session:
        written = outcome_spool.apply_file_spools(session, redis, spools)
    if written:
        log.warning("wrote %d outcomes spooled by workers that died before the database answered", len(written))


def _run_worker(
    settings: Settings,
    sessions: sessionmaker[Session],
    redis: Redis,
    *,
    slot: str,
    models: list[str] | None,
    burst: bool,
    gpu_share: int,
) -> None:
    device = device_or_refuse(settings, sessions)
    memory = GpuMemory(device.gpu_uuids)
    prefix_cache = open_prefix_cache(settings)

    load = _model_loader(settings, device, memory, prefix_cache, lambda: catalog.slot)

    step_back = StepBack()
    catalog = ModelCatalog(
        sessions,
        gpu_uuids=device.gpu_uuids,
        only=models,
        skip=lambda: health.too_small_models(redis, device.gpu_uuids) | step_back.models(),
        gpu_share=gpu_share,
    )
    catalog.refresh()
    budget = catalog.slot.budget_mib if catalog.slot is not None and catalog.slot.memory_total_mib else None
    cache = ModelCache(
        load,
        max_loaded=settings.worker_max_loaded_models,
        budget_mib=budget,
        on_load=lambda spec, seconds: metrics.record_model_load(redis, spec.name, seconds),
        fits_now=memory.fits_now if device.on_gpu else None,
    )
    streams = StreamPublisher(redis)  # token streams of interactive calls (OpenAI's and Ollama's APIs)
    name = worker_name(slot)
    spools = outcome_spool.spool_dir(settings.data_dir)
    _write_spooled_outcomes(sessions, redis, spools)
    writer = OutcomeWriter(sessions, redis=redis, worker=name, streams=streams, spool_dir=spools)

    runner = _job_runner(settings, sessions, redis, device, memory, catalog, cache, step_back, writer, streams, name)
    worker = GpuqWorker(
        runner=runner,
        list_servable=catalog.refresh,
        loaded_models=cache.loaded_names,
        model_expiries=cache.expiries,
        on_idle=cache.unload_expired,
        unload_model=cache.unload,  # an admin's unload (POST /v1/models/{name}/unload)
        worker_ttl_s=settings.worker_ttl_s,
        heartbeat_interval_s=settings.worker_heartbeat_interval_s,
        queue_refresh_interval_s=settings.worker_refresh_interval_s,
        job_timeout_s=settings.job_timeout_s,
        slots=settings.slots_for(on_gpu=device.on_gpu),
        preemption=settings.worker_preemption != "off",
        prefix_cache_stats=prefix_cache.stats,
        prefix_index=(lambda: held_hashes(prefix_cache, cache.loaded_models()))
        if settings.prefix_routing == "on"
        else None,
        steal_s=settings.prefix_routing_steal_s,
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
        worker.work(burst=burst, logging_level=None)  # levels from gpuq.log_config
    finally:
        writer.stop()
        cache.clear()  # each model's free streams saved to the prefix cache as it closes
        prefix_cache.close()  # what it queued for the disk written
    if not burst and worker.ended_unasked:
        _exit_on(worker.job_error)


def _model_loader(
    settings: Settings,
    device: Device,
    memory: GpuMemory,
    prefix_cache: PrefixCache,
    slot: Callable[[], Slot | None],
) -> Callable[[ModelSpec], LoadedModel]:
    """How the worker's model cache loads a model: the settings' engine, on this device, split
    over the slot's GPUs when it has several."""

    def load(spec: ModelSpec) -> LoadedModel:
        targets = slot()
        group = targets is not None and len(targets.targets) > 1 and device.on_gpu
        totals = [t.memory_total_mib for t in targets.targets] if targets is not None else []
        loaded = LoadedModel(
            spec.path,
            n_ctx=spec.n_ctx,
            embedding=spec.embedding,
            threads=settings.llama_threads,
            gpu_layers=device.gpu_layers,
            tensor_split=memory.tensor_split(spec, totals) if group else None,
            slots=settings.slots_for(on_gpu=device.on_gpu),
            prompt_cache=settings.worker_prompt_cache,
            flash_attn=settings.worker_flash_attn,
            any_prefix=None if settings.worker_prompt_reuse == "auto" else settings.worker_prompt_reuse == "any-prefix",
            prefix_cache=prefix_cache,
            shared_tenants=settings.worker_prefix_cache_shared_tenants,
            strict_priority=None if settings.worker_preemption == "auto" else settings.worker_preemption == "strict",
        )
        memory.cuda_started = device.on_gpu
        return loaded

    return load


def _job_runner(
    settings: Settings,
    sessions: sessionmaker[Session],
    redis: Redis,
    device: Device,
    memory: GpuMemory,
    catalog: ModelCatalog,
    cache: ModelCache,
    step_back: StepBack,
    writer: OutcomeWriter,
    streams: StreamPublisher,
    name: str,
) -> JobRunner:
    """Claim, run and outcome of each job, with the ways a job goes back to its queue."""

    def mark_unhealthy(reason: str) -> None:
        health.mark_unhealthy(sessions, device.gpu_uuids, reason)

    return JobRunner(
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
            sessions,
            redis,
            worker=name,
            gpu_uuids=device.gpu_uuids,
            timeout_s=settings.job_timeout_s,
            too_small_ttl_s=settings.gpu_too_small_ttl_s,
            others_hold=memory.held_by_others if device.on_gpu else lambda: None,
            step_back=step_back,
        ),
        send_back=send_back_to_queue(sessions, redis, worker=name, timeout_s=settings.job_timeout_s),
        health=GpuHealth(mark_unhealthy) if device.on_gpu else None,
        energy=energy_meter_for(device, sample_interval_s=settings.energy_sample_interval_s),
        streams=streams,
    )


def open_prefix_cache(settings: Settings) -> PrefixCache:
    """The worker's prefix cache, for every model it loads (a start is keyed by its model file):
    its RAM bound as the settings or the supervisor give it (-1 here: a worker started alone,
    the host's share for one worker), and the disk tier if a directory is set."""
    ram = ram_limit_bytes(settings.worker_prefix_cache_ram_bytes, available=mem_available_bytes())
    directory = Path(settings.worker_prefix_cache_dir) if settings.worker_prefix_cache_dir else None
    cache = PrefixCache.open(
        ram_limit_bytes=ram, disk_dir=directory, disk_limit_bytes=settings.worker_prefix_cache_disk_bytes
    )
    log.info(
        "prefix cache: %d MiB of host RAM%s",
        ram >> 20,
        f", disk tier in {directory}" if cache.disk is not None else "",
    )
    return cache


def _exit_on(error: Exception | None) -> NoReturn:
    """RQ's loop ended on an error it logged and swallowed; exiting 0 would tell the
    supervisor the worker stopped as asked. An outage says so (restarted, not counted); any
    other error is a defect of the worker (recorded as a crash, restarted)."""
    if error is not None and is_outage(error):
        log.error("Redis or the database went away under a job; exiting to be restarted: %s", error)
        raise SystemExit(EXIT_OUTAGE)
    log.error("the worker's loop stopped on an error (its traceback is above); exiting to be restarted")
    raise SystemExit(EXIT_DEFECT)
