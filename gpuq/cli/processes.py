"""The commands that run gpuq's processes on this machine: the whole system (``up``,
``demo``), or one part of it (``api``, ``worker``, ``supervisor``, ``scheduler``).

Heavy imports (llama.cpp, FastAPI) happen inside the commands that need them, so
``gpuq worker --gpus`` can set ``CUDA_VISIBLE_DEVICES`` before CUDA loads."""

from __future__ import annotations

import sys
import threading

import click

from gpuq.cli.errors import stop
from gpuq.cli.serving import listen, serve
from gpuq.cli.support import remember_url
from gpuq.settings import Settings, get_settings


def _with_redis(settings: Settings) -> Settings:
    """The settings of a process that needs a shared Redis; without GPUQ_REDIS_URL, one line that says so."""
    try:
        settings.require_redis_url()
    except RuntimeError as exc:
        stop(str(exc))
    return settings


@click.command()
@click.option("--workers", default=1, show_default=True, help="CPU workers to start")
@click.option("--host", default=None, help="API host (default GPUQ_API_HOST)")
@click.option("--port", default=None, type=int, help="API port (default GPUQ_API_PORT)")
@click.option("--access-log", is_flag=True, help="log every request (default: writes and errors, not the reads)")
def up(workers: int, host: str | None, port: int | None, access_log: bool) -> None:
    """Run everything on this machine: private Redis (unless GPUQ_REDIS_URL), migrations,
    workers, the reconciler and the API. Ctrl-C stops it all. Its address is saved in the
    data directory (api.url), where later CLI commands find it without --url."""
    settings = get_settings()
    host, port = host or settings.api_host, port or settings.api_port
    sock = listen(host, port)  # before anything else starts

    from api.main import create_app
    from gpuq.local.embedded import embedded_system

    with sock, embedded_system(settings, workers=workers) as system:
        # Once the data directory is this process's: the next CLI command finds it without --url.
        remember_url(system.settings.data_dir, host, port)
        serve(create_app(system.settings), sock, quiet_reads=not access_log)


@click.command()
@click.option("--host", default=None)
@click.option("--port", default=None, type=int)
def api(host: str | None, port: int | None) -> None:
    """Serve the HTTP API (needs GPUQ_REDIS_URL and a migrated database)."""
    from api.main import create_app

    settings = _with_redis(get_settings())
    sock = listen(host or settings.api_host, port or settings.api_port)
    with sock:
        serve(create_app(settings), sock, quiet_reads=False)


@click.command()
@click.option("--slot", default="cpu", show_default=True, help="name of this worker's slot (part of its name)")
@click.option("--gpus", default=None, help="comma-separated GPU UUIDs to pin to (sets CUDA_VISIBLE_DEVICES)")
@click.option("--model", "models", multiple=True, help="serve only these models (default: all registered)")
@click.option("--burst", is_flag=True, help="exit when the queues are empty")
@click.option("--gpu-share", default=1, show_default=True, help="workers sharing these GPUs (each budgets its share)")
def worker(slot: str, gpus: str | None, models: tuple[str, ...], burst: bool, gpu_share: int) -> None:
    """Run one worker: pulls jobs from Redis, runs them with llama.cpp, writes results to SQL."""
    from worker.device import pin_to_gpus

    settings = _with_redis(get_settings())
    if gpus:
        pin_to_gpus([g.strip() for g in gpus.split(",") if g.strip()])
    from worker.main import run_worker  # imports llama.cpp, after pinning

    run_worker(settings, slot=slot, models=list(models) or None, burst=burst, gpu_share=max(1, gpu_share))


@click.command()
@click.option("--cpu-workers", default=1, show_default=True, help="workers to run when this host has no GPU")
@click.option("--slots-per-gpu", default=1, show_default=True, help="workers per GPU")
def supervisor(cpu_workers: int, slots_per_gpu: int) -> None:
    """Run this host's workers: one pinned worker per GPU slot, restarted if they die."""
    from worker.supervisor import run_supervisor

    run_supervisor(_with_redis(get_settings()), cpu_workers=cpu_workers, slots_per_gpu=slots_per_gpu)


@click.command()
def scheduler() -> None:
    """Run the scheduler: priority aging, cron schedules, batch finalisation, webhooks, the
    SQL-to-Redis reconciler and stats rollups. Safe to run more than one."""
    from gpuq.scheduler import run_scheduler

    run_scheduler(_with_redis(get_settings()), threading.Event())


@click.command()
@click.option("--workers", default=1, show_default=True)
def demo(workers: int) -> None:
    """Start gpuq on embedded defaults, run sample generation and embedding jobs, print them, stop."""
    from gpuq.cli.demo import run_demo

    sys.exit(run_demo(get_settings(), workers=workers))


COMMANDS = (up, demo, api, worker, supervisor, scheduler)
