"""``gpuq job ID`` and ``gpuq cancel ID``: one job's record, and stopping it."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuq.cli.deadline import shown
from gpuq.cli.support import connect, duration, url_option

_FIELDS = (
    ("status", "status"),
    ("kind", "kind"),
    ("model", "model"),
    ("priority", "priority"),
    ("owner", "owner"),
    ("created", "created_at"),
    ("deadline", "deadline"),
    ("started", "started_at"),
    ("finished", "finished_at"),
    ("queue wait", "queue_wait_ms"),
    ("load", "load_ms"),
    ("run", "run_ms"),
    ("prompt tokens", "prompt_tokens"),
    ("completion tokens", "completion_tokens"),
    ("worker", "worker"),
    ("device", "device"),
    ("attempts", "attempts"),
    ("batch", "batch_id"),
    ("error", "error"),
)


@click.command()
@url_option
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="the job as the API returns it")
def job(url: str, job_id: str, as_json: bool) -> None:
    """Show one job: its status, timings, tokens, where it ran, and its result."""
    with connect(url) as client:
        found = client.job(job_id)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(found["id"])
    for label, key in _FIELDS:
        value: Any
        if key.endswith("_ms"):
            value = duration(found[key])
        elif key == "deadline":
            value = shown(found.get(key), found["status"])
        else:
            value = found.get(key)
        if value is not None and value != "":
            click.echo(f"  {label:<18} {value}")
    if found.get("cancel_requested") and found["status"] == "running":
        click.echo("  cancel requested: it stops at its next token")
    _show_result(found.get("result"))


def _show_result(result: dict[str, Any] | None) -> None:
    if not result:
        return
    if "text" in result:
        click.echo(f"  finish reason      {result.get('finish_reason')}")
        click.echo(result["text"])
    elif "embeddings" in result:
        click.echo(f"  vectors            {len(result['embeddings'])} of {result.get('dimensions')} dimensions")


@click.command()
@url_option
@click.argument("job_id")
def cancel(url: str, job_id: str) -> None:
    """Cancel a job: a queued one at once, a running one at its next token."""
    with connect(url) as client:
        found = client.cancel(job_id)
    if found["status"] == "cancelled":
        click.echo(f"cancelled {job_id}")
    else:
        click.echo(f"{job_id} is running; it stops at its next token (gpuq job {job_id} shows its end)")


COMMANDS = (job, cancel)
