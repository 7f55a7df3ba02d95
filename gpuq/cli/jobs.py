"""``gpuq submit`` and ``gpuq jobs``: one job, and the recent ones."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import click

from gpuq.cli.deadline import deadline_option, shown
from gpuq.cli.support import connect, duration, table, url_option


@click.command()
@url_option
@click.argument("model")
@click.argument("text", nargs=-1, required=True)
@click.option("--kind", type=click.Choice(["generate", "embed"]), default="generate", show_default=True)
@click.option("--raw", is_flag=True, help="send TEXT as a plain prompt, without the model's chat template")
@click.option("--chat", is_flag=True, hidden=True, help="the default now: TEXT is a user chat message")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.8, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--priority", default="normal", show_default=True, help="high, normal or low")
@deadline_option
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait for the result and print it")
def submit(
    url: str,
    model: str,
    text: tuple[str, ...],
    kind: str,
    raw: bool,
    chat: bool,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    priority: str,
    deadline: datetime | None,
    wait: bool,
) -> None:
    """Submit one job and print its id at once, then (unless --no-wait) its result. TEXT is a
    user message rendered with the model's chat template (--raw: a plain prompt); for
    `--kind embed`, each TEXT argument is one input. Ctrl-C stops waiting, not the job."""
    job: dict[str, Any] = {"kind": kind, "model": model, "priority": priority}
    if deadline is not None:
        job["deadline"] = deadline.isoformat()
    if kind == "embed":
        job["input"] = list(text)
    else:
        prompt = " ".join(text)
        job |= {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        job |= {"prompt": prompt} if raw else {"messages": [{"role": "user", "content": prompt}]}
    with connect(url) as client:
        created = client.submit(job)
        if not wait:
            click.echo(created["id"])
            return
        click.echo(f"{created['id']} {created['status']}", err=True)
        try:
            done = client.wait(created["id"])
        except KeyboardInterrupt:
            click.echo(f"\nstopped waiting; `gpuq job {created['id']}` shows it, `gpuq cancel` stops it", err=True)
            sys.exit(130)
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


@click.command()
@url_option
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]),
    help="filter by status (repeatable)",
)
@click.option("--model", default=None)
@click.option("--kind", type=click.Choice(["generate", "embed", "noop"]), default=None)
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
def jobs(url: str, statuses: tuple[str, ...], model: str | None, kind: str | None, limit: int) -> None:
    """List recent jobs as a table (with a DEADLINE column when one of them has a deadline)."""
    with connect(url) as client:
        page = client.jobs(status=list(statuses) or None, model=model, kind=kind, limit=limit)
    headers: tuple[str, ...] = ("ID", "KIND", "MODEL", "PRIORITY", "STATUS", "WAIT", "RUN", "TOKENS", "DEVICE")
    rows: list[tuple[str, ...]] = [
        (
            j["id"],
            j["kind"],
            j["model"],
            j["priority"],
            j["status"],
            duration(j["queue_wait_ms"]),
            duration(j["run_ms"]),
            str(j["completion_tokens"] or ""),
            j["device"] or "",
        )
        for j in page["data"]
    ]
    # Most jobs have no deadline: the column is there only when it says something.
    if any(j.get("deadline") for j in page["data"]):
        headers += ("DEADLINE",)
        rows = [(*r, shown(j.get("deadline"), j["status"])) for r, j in zip(rows, page["data"], strict=True)]
    filtered = bool(statuses or model or kind)
    table(headers, rows, empty="no jobs match" if filtered else "no jobs yet")


COMMANDS = (submit, jobs)
