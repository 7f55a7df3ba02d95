"""The ``gpuq`` command. Heavy imports (llama.cpp, FastAPI) happen inside the commands that
need them, so ``gpuq worker --gpus`` can set ``CUDA_VISIBLE_DEVICES`` before CUDA loads."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import click

from gpuq.cli.admin import admin
from gpuq.cli.keys import keys
from gpuq.cli.rules import rules
from gpuq.cli.schedules import schedules
from gpuq.cli.support import connect, table, url_option
from gpuq.settings import get_settings


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def main(verbose: bool) -> None:
    """gpuq: durable priority queues for LLM generation and embedding jobs on GPUs."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)


# ---------------------------------------------------------------- processes


@main.command()
@click.option("--workers", default=1, show_default=True, help="CPU workers to start")
@click.option("--host", default=None, help="API host (default GPUQ_API_HOST)")
@click.option("--port", default=None, type=int, help="API port (default GPUQ_API_PORT)")
def up(workers: int, host: str | None, port: int | None) -> None:
    """Run everything on this machine: private Redis (unless GPUQ_REDIS_URL), migrations,
    workers, the reconciler and the API. Ctrl-C stops it all."""
    import uvicorn

    from api.main import create_app
    from gpuq.local.embedded import embedded_system

    settings = get_settings()
    with embedded_system(settings, workers=workers) as system:
        app = create_app(system.settings)
        uvicorn.run(app, host=host or settings.api_host, port=port or settings.api_port, log_level="info")


@main.command()
@click.option("--host", default=None)
@click.option("--port", default=None, type=int)
def api(host: str | None, port: int | None) -> None:
    """Serve the HTTP API (needs GPUQ_REDIS_URL and a migrated database)."""
    import uvicorn

    from api.main import create_app

    settings = get_settings()
    settings.require_redis_url()
    uvicorn.run(create_app(settings), host=host or settings.api_host, port=port or settings.api_port)


@main.command()
@click.option("--slot", default="cpu", show_default=True, help="name of this worker's slot (part of its name)")
@click.option("--gpus", default=None, help="comma-separated GPU UUIDs to pin to (sets CUDA_VISIBLE_DEVICES)")
@click.option("--model", "models", multiple=True, help="serve only these models (default: all registered)")
@click.option("--burst", is_flag=True, help="exit when the queues are empty")
def worker(slot: str, gpus: str | None, models: tuple[str, ...], burst: bool) -> None:
    """Run one worker: pulls jobs from Redis, runs them with llama.cpp, writes results to SQL."""
    from worker.device import pin_to_gpus

    if gpus:
        pin_to_gpus([g.strip() for g in gpus.split(",") if g.strip()])
    from worker.main import run_worker  # imports llama.cpp, after pinning

    run_worker(get_settings(), slot=slot, models=list(models) or None, burst=burst)


@main.command()
@click.option("--cpu-workers", default=1, show_default=True, help="workers to run when this host has no GPU")
@click.option("--slots-per-gpu", default=1, show_default=True, help="workers per GPU")
def supervisor(cpu_workers: int, slots_per_gpu: int) -> None:
    """Run this host's workers: one pinned worker per GPU slot, restarted if they die."""
    from worker.supervisor import run_supervisor

    run_supervisor(get_settings(), cpu_workers=cpu_workers, slots_per_gpu=slots_per_gpu)


@main.command()
def gpus() -> None:
    """This host's GPUs as the supervisor sees them (NVML, or the simulated inventory)."""
    from gpuq.fleet.gpus import discover_gpus

    settings = get_settings()
    inventory = discover_gpus(simulated=settings.simulated_gpus, host=settings.host_label)
    if not inventory.gpus:
        click.echo(f"{inventory.host}: no GPU found (NVML unavailable); workers run on the CPU")
        return
    click.echo(f"{inventory.host}: {len(inventory.gpus)} GPU(s) from {inventory.source}")
    table(
        ("INDEX", "UUID", "NAME", "MEMORY", "FREE", "UTIL", "TEMP", "POWER", "CC"),
        [
            (
                str(g.index),
                g.uuid,
                g.name,
                f"{g.memory_total_mib} MiB",
                f"{g.memory_free_mib} MiB",
                _maybe(g.utilisation_pct, "%"),
                _maybe(g.temperature_c, " C"),
                _maybe(g.power_w, " W"),
                g.compute_capability or "",
            )
            for g in inventory.gpus
        ],
    )


def _maybe(value: float | int | None, unit: str) -> str:
    return "" if value is None else f"{value:g}{unit}"


@main.command()
def scheduler() -> None:
    """Run the scheduler: priority aging, cron schedules, batch finalisation, webhooks, the
    SQL-to-Redis reconciler and stats rollups. Safe to run more than one."""
    from gpuq.scheduler import run_scheduler

    run_scheduler(get_settings(), threading.Event())


@main.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations and register the bundled model."""
    from gpuq.auth.admin_key import key_file
    from gpuq.db import migrate
    from gpuq.local.embedded import prepare_database

    settings = get_settings()
    if revision == "head":
        new_key = prepare_database(settings)
        if new_key is not None:
            click.echo(f"created the first admin API key (shown once; also in {key_file(settings.data_dir)}):")
            click.echo(f"    {new_key}")
    else:
        migrate.upgrade(settings.database_url, revision)
    click.echo(f"database at {revision}: {settings.database_url}")


# ---------------------------------------------------------------- client commands


@main.command()
@url_option
@click.argument("model")
@click.argument("text", nargs=-1, required=True)
@click.option("--kind", type=click.Choice(["generate", "embed"]), default="generate", show_default=True)
@click.option("--chat", is_flag=True, help="send TEXT as a user chat message (uses the model's chat template)")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.8, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--priority", default="normal", show_default=True, help="high, normal or low")
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait for the result and print it")
def submit(
    url: str,
    model: str,
    text: tuple[str, ...],
    kind: str,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    priority: str,
    wait: bool,
) -> None:
    """Submit one job. For `--kind embed`, each TEXT argument is one input."""
    job: dict[str, Any] = {"kind": kind, "model": model, "priority": priority}
    if kind == "embed":
        job["input"] = list(text)
    else:
        prompt = " ".join(text)
        job |= {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        job |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    with connect(url) as client:
        created = client.submit(job)
        if not wait:
            click.echo(created["id"])
            return
        done = client.wait(created["id"])
    _print_result(done)


def _print_result(job: dict[str, Any]) -> None:
    if job["status"] != "succeeded":
        click.echo(f"{job['id']} {job['status']}: {job.get('error') or ''}".rstrip(), err=True)
        sys.exit(1)
    result = job["result"] or {}
    if "text" in result:
        click.echo(result["text"])
    elif "embeddings" in result:
        for vector in result["embeddings"]:
            head = ", ".join(f"{x:.4f}" for x in vector[:4])
            click.echo(f"[{head}, ...] ({len(vector)} dims)")
    else:
        click.echo(json.dumps(result))


@main.command()
@url_option
@click.option("--status", "statuses", multiple=True, help="filter by status (repeatable)")
@click.option("--model", default=None)
@click.option("--kind", default=None)
@click.option("--limit", default=20, show_default=True)
def jobs(url: str, statuses: tuple[str, ...], model: str | None, kind: str | None, limit: int) -> None:
    """List recent jobs as a table."""
    with connect(url) as client:
        page = client.jobs(status=list(statuses) or None, model=model, kind=kind, limit=limit)
    rows = [
        (
            j["id"],
            j["kind"],
            j["model"],
            j["priority"],
            j["status"],
            _ms(j["queue_wait_ms"]),
            _ms(j["run_ms"]),
            str(j["completion_tokens"] or ""),
            j["device"] or "",
        )
        for j in page["data"]
    ]
    table(("ID", "KIND", "MODEL", "PRIORITY", "STATUS", "WAIT", "RUN", "TOKENS", "DEVICE"), rows)


@main.group(invoke_without_command=True)
@url_option
@click.pass_context
def models(ctx: click.Context, url: str) -> None:
    """List registered models (or `models register`)."""
    ctx.obj = url
    if ctx.invoked_subcommand is not None:
        return
    with connect(url) as client:
        data = client.models()
    table(
        ("NAME", "KINDS", "CONTEXT", "SIZE", "PATH"),
        [
            (m["id"], ",".join(m["kinds"]), str(m["context_length"]), f"{m['size_bytes'] / 2**20:.0f} MiB", m["path"])
            for m in data
        ],
    )


@models.command("register")
@click.argument("name")
@click.argument("path")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["generate", "embed"]), default=["generate"])
@click.option("--context-length", type=int, default=None)
@click.pass_obj
def models_register(url: str, name: str, path: str, kinds: tuple[str, ...], context_length: int | None) -> None:
    """Register NAME for the GGUF file PATH (relative to the models directory)."""
    with connect(url) as client:
        model = client.register_model(
            {"name": name, "path": path, "kinds": list(kinds), "context_length": context_length}
        )
    click.echo(f"registered {model['id']} ({', '.join(model['kinds'])}, context {model['context_length']})")


@main.group()
def batch() -> None:
    """OpenAI-style batches: submit a JSONL file, follow it, fetch results, cancel."""


@batch.command("submit")
@url_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--wait", is_flag=True, help="follow it with a progress bar until it ends")
@click.option("--priority", default="low", show_default=True)
def batch_submit(url: str, path: str, wait: bool, priority: str) -> None:
    """Upload PATH and run it as a batch; prints the batch id."""
    from gpuq.cli.batches import submit as submit_batch

    submit_batch(url, path, wait=wait, priority=priority)


@batch.command("status")
@url_option
@click.argument("batch_id")
@click.option("--follow", is_flag=True, help="draw a progress bar until it ends")
def batch_status(url: str, batch_id: str, follow: bool) -> None:
    from gpuq.cli import batches as batch_cli

    with connect(url) as client:
        found = batch_cli.follow(client, batch_id) if follow else client.batch(batch_id)
    click.echo(batch_cli.summary(found))


@batch.command("results")
@url_option
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="write here, not to stdout")
def batch_results(url: str, batch_id: str, output: str | None) -> None:
    """Output and error lines answered so far (all of them once the batch has ended)."""
    with connect(url) as client:
        text = client.batch_results(batch_id)
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)


@batch.command("cancel")
@url_option
@click.argument("batch_id")
def batch_cancel(url: str, batch_id: str) -> None:
    from gpuq.cli.batches import summary

    with connect(url) as client:
        click.echo(summary(client.cancel_batch(batch_id)))


@main.command("run-batch")
@click.option("-i", "--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False))
@click.option("--workers", default=1, show_default=True)
def run_batch(input_path: str, output_path: str, workers: int) -> None:
    """Run a whole JSONL batch file on embedded defaults, without a server (like vllm run-batch)."""
    from gpuq.cli.batches import run_batch as run

    sys.exit(run(get_settings(), input_path, output_path, workers=workers))


@main.command()
@click.option("--workers", default=1, show_default=True)
def demo(workers: int) -> None:
    """Start gpuq on embedded defaults, run sample generation and embedding jobs, print them, stop."""
    from gpuq.local.demo import run_demo

    sys.exit(run_demo(get_settings(), workers=workers))


def _ms(value: int | None) -> str:
    return "" if value is None else f"{value} ms"


for group in (rules, schedules, keys, admin):
    main.add_command(group)

if __name__ == "__main__":
    main()
