"""`gpuq admin`: workers, drain, unload, retry and requeue, through the API with the admin key
(``GPUQ_API_KEY``, or the key `gpuq up` saved in the data directory)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from gpuq.cli.client import GpuqClient
from gpuq.cli.support import connect, table, url_option


def _call(url: str, action: Callable[[GpuqClient], Any]) -> Any:
    """Run one API call (an API refusal ends the command, see ``connect``)."""
    with connect(url) as client:
        return action(client)


def _ago(stamp: str | None) -> str:
    if not stamp:
        return ""
    seconds = (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()
    return f"{max(seconds, 0):.0f}s ago"


def _worker_line(w: dict[str, Any]) -> str:
    held = f" by {'+'.join(w['drained_by'])}" if w["drained_by"] else ""
    return f"{w['name']}: {w['state']}{held}" + (f", running {w['current_job']}" if w["current_job"] else "")


@click.group()
def admin() -> None:
    """Admin actions: workers, drain/undrain, unload, retry, requeue, clear a GPU."""


@admin.command("workers")
@url_option
def workers(url: str) -> None:
    """Every live worker: state, current job, loaded models, heartbeat, jobs done."""
    listing = _call(url, lambda c: c.workers())
    table(
        ("NAME", "HOST", "SLOT", "STATE", "JOB", "MODELS", "HEARTBEAT", "DONE", "DEVICE"),
        [
            (
                w["name"],
                w["host"],
                w["slot"],
                w["state"] + (f" ({'+'.join(w['drained_by'])})" if w["drained_by"] else ""),
                w["current_job"] or "",
                ",".join(w["loaded_models"]),
                _ago(w["last_heartbeat"]),
                str(w["jobs_done"]),
                w["device"],
            )
            for w in listing["data"]
        ],
        empty="no workers running (`gpuq up` or `gpuq supervisor` starts them)",
    )
    if listing["drained_hosts"]:
        click.echo(f"drained hosts: {', '.join(listing['drained_hosts'])}")


@admin.command("drain")
@url_option
@click.argument("worker")
def drain(url: str, worker: str) -> None:
    """WORKER finishes its job and takes no more until undrained."""
    click.echo(_worker_line(_call(url, lambda c: c.drain(worker))))


@admin.command("undrain")
@url_option
@click.argument("worker")
def undrain(url: str, worker: str) -> None:
    """WORKER takes jobs again (unless its host is drained)."""
    click.echo(_worker_line(_call(url, lambda c: c.drain(worker, undo=True))))


def _host_summary(result: dict[str, Any]) -> None:
    verb = "drained" if result["drained"] else "undrained"
    click.echo(f"host {result['host']} {verb}" + ("" if result["changed"] else " (it already was)"))
    for w in result["workers"]:
        click.echo(f"  {_worker_line(w)}")


@admin.command("drain-host")
@url_option
@click.argument("host")
def drain_host(url: str, host: str) -> None:
    """Every worker of HOST, including workers started there later, until undrained."""
    _host_summary(_call(url, lambda c: c.drain_host(host)))


@admin.command("undrain-host")
@url_option
@click.argument("host")
def undrain_host(url: str, host: str) -> None:
    """HOST's workers take jobs again (except those drained one by one)."""
    _host_summary(_call(url, lambda c: c.drain_host(host, undo=True)))


@admin.command("unload")
@url_option
@click.argument("model")
@click.option("--worker", default=None, help="only from this worker")
def unload(url: str, model: str, worker: str | None) -> None:
    """Unload MODEL from every worker holding it (at once if idle, else after its job)."""
    result = _call(url, lambda c: c.unload(model, worker=worker))
    if result["workers"]:
        click.echo(f"{model}: unloading on {', '.join(result['workers'])}")
    else:
        click.echo(f"{model}: no worker holds it")


@admin.command("retry")
@url_option
@click.argument("job_id")
def retry(url: str, job_id: str) -> None:
    """Queue a failed or cancelled job again (same id)."""
    job = _call(url, lambda c: c.retry(job_id))
    click.echo(f"{job['id']} {job['status']} (attempts so far: {job['attempts']})")


@admin.command("requeue")
@url_option
@click.argument("job_id")
def requeue(url: str, job_id: str) -> None:
    """Push a queued job's lost queue entry again, or take a running job back from a stuck worker."""
    result = _call(url, lambda c: c.requeue(job_id))
    click.echo(f"{result['job']['id']} {result['job']['status']}: {result['action']}")


@admin.command("retry-failed")
@url_option
@click.option("--model", default=None)
@click.option("--kind", type=click.Choice(["generate", "embed", "noop"]), default=None)
@click.option("--priority", type=click.Choice(["high", "normal", "low"]), default=None)
@click.option("--owner", default=None, help="one tenant's jobs (default: every tenant's)")
@click.option("--since", "created_after", default=None, help="created at or after, ISO 8601 with a zone")
@click.option("--before", "created_before", default=None, help="created before, ISO 8601 with a zone")
@click.option("--cancelled", is_flag=True, help="cancelled jobs too")
def retry_failed(url: str, cancelled: bool, **selection: str | None) -> None:
    """Retry every failed job the options select (at most 10,000 a call)."""
    body: dict[str, str | list[str]] = {k: v for k, v in selection.items() if v is not None}
    body["status"] = ["failed", "cancelled"] if cancelled else ["failed"]
    result = _call(url, lambda c: c.retry_jobs(**body))
    click.echo(f"{result['changed']} of {result['matched']} matching jobs queued again")


@admin.command("clear-gpu")
@url_option
@click.argument("uuid")
def clear_gpu(url: str, uuid: str) -> None:
    """Mark a GPU healthy again after looking at it; its worker serves models again."""
    result = _call(url, lambda c: c.clear_gpu(uuid))
    click.echo(f"{result['uuid']}: {result['status']}")
