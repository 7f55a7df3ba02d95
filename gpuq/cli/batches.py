"""`gpuq batch ...` and `gpuq run-batch`: batches from the command line, with a progress bar."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gpuq.batches.window import ACCEPTED, window_seconds
from gpuq.cli.client import GpuqClient
from gpuq.cli.support import connect, url_option
from gpuq.log_config import only_warnings
from gpuq.settings import Settings, get_settings

F = TypeVar("F", bound=Callable[..., Any])

FINAL = {"completed", "failed", "expired", "cancelled"}


def checked_window(window: str) -> str:
    """``--completion-window`` as the API would take it: a mistake is a usage error before the
    file is uploaded."""
    try:
        window_seconds(window)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return window


def completion_window_option(what: str) -> Callable[[F], F]:
    """``--completion-window`` (default 24h), checked before anything is uploaded; ``what``: what
    the window is of, in the help."""
    return click.option(
        "--completion-window",
        default="24h",
        show_default=True,
        callback=lambda _ctx, _param, value: checked_window(value),
        help=f"{what}; {ACCEPTED}",
    )


def first_endpoint(path: str) -> str:
    """A batch's `endpoint` is its first line's (lines may mix endpoints in gpuq)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                return str(json.loads(raw).get("url", "/v1/chat/completions"))
    raise click.ClickException(f"{path} has no lines")


class Interrupted(Exception):
    """Ctrl-C while following a batch; ``batch`` is how it stood when last read."""

    def __init__(self, batch: dict) -> None:
        super().__init__(batch["id"])
        self.batch = batch


def follow(client: GpuqClient, batch_id: str) -> dict:
    """Poll the batch, drawing a progress bar of answered lines on stderr, until it ends; its
    estimate of the time left is labelled "ETA" (click prints a bare clock)."""
    batch = client.batch(batch_id)
    total = batch["request_counts"]["total"]
    shown = 0
    with click.progressbar(
        length=total,
        label=f"{batch_id} lines",
        file=sys.stderr,
        show_pos=True,
        show_eta=False,
        item_show_func=lambda eta: eta,
    ) as bar:
        try:
            while True:
                counts = batch["request_counts"]
                done = counts["completed"] + counts["failed"]
                bar.update(done - shown, current_item=f"ETA {bar.format_eta()}" if 0 < done < total else None)
                shown = done
                if batch["status"] in FINAL:
                    return batch
                time.sleep(0.5)
                batch = client.batch(batch_id)
        except KeyboardInterrupt:
            raise Interrupted(batch) from None


def summary(batch: dict) -> str:
    counts = batch["request_counts"]
    return (
        f"{batch['id']} {batch['status']}: {counts['completed']} completed, {counts['failed']} failed "
        f"of {counts['total']}"
    )


def submit(url: str, path: str, *, wait: bool, priority: str, completion_window: str = "24h") -> None:
    with connect(url) as client:
        file = client.upload(path)
        batch = client.create_batch(
            file["id"], endpoint=first_endpoint(path), priority=priority, completion_window=completion_window
        )
        click.echo(batch["id"])
        if wait:
            click.echo(summary(follow(client, batch["id"])), err=True)


def run_batch(settings: Settings, input_path: str, output_path: str, *, workers: int) -> int:
    """Run a whole file on embedded defaults, without a server: like `vllm run-batch`."""
    from gpuq.cli.demo import serve_api
    from gpuq.local.embedded import embedded_system

    with tempfile.TemporaryDirectory(prefix="gpuq-run-batch-") as tmp:
        if not {"data_dir", "database_url"} & settings.model_fields_set:  # nothing to keep: a throwaway database
            settings = settings.model_copy(update={"data_dir": Path(tmp), "database_url": f"sqlite:///{tmp}/gpuq.db"})
        with (
            only_warnings(),
            embedded_system(settings, workers=workers) as system,
            serve_api(system.settings) as url,
            GpuqClient(url, api_key=system.api_key) as client,
        ):
            client.wait_ready()
            file = client.upload(input_path)
            batch = client.create_batch(file["id"], endpoint=first_endpoint(input_path), priority="normal")
            try:
                final = follow(client, batch["id"])
            except Interrupted as stopped:
                so_far = summary(stopped.batch)
                click.echo(f"\ninterrupted: {so_far} so far; nothing written to {output_path}", err=True)
                return 130
            Path(output_path).write_text(client.batch_results(batch["id"]))
    click.echo(summary(final) + f"; results in {output_path}", err=True)
    return 0 if final["status"] == "completed" else 1


# ---------------------------------------------------------------- the commands


@click.group()
def batch() -> None:
    """OpenAI-style batches: submit a JSONL file, follow it, fetch results, cancel."""


@batch.command("submit")
@url_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--wait", is_flag=True, help="follow it with a progress bar until it ends")
@click.option("--priority", default="low", show_default=True)
@completion_window_option(
    "when the batch expires, its lines' deadline (the API refuses at once a batch the fleet cannot finish in it)"
)
def batch_submit(url: str, path: str, wait: bool, priority: str, completion_window: str) -> None:
    """Upload PATH and run it as a batch; prints the batch id."""
    submit(url, path, wait=wait, priority=priority, completion_window=completion_window)


@batch.command("status")
@url_option
@click.argument("batch_id")
@click.option("--follow", "follow_it", is_flag=True, help="draw a progress bar until it ends")
def batch_status(url: str, batch_id: str, follow_it: bool) -> None:
    with connect(url) as client:
        found = follow(client, batch_id) if follow_it else client.batch(batch_id)
    click.echo(summary(found))


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
    with connect(url) as client:
        click.echo(summary(client.cancel_batch(batch_id)))


@click.command("run-batch")
@click.option("-i", "--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False))
@click.option("--workers", default=1, show_default=True)
def run_batch_command(input_path: str, output_path: str, workers: int) -> None:
    """Run a whole JSONL batch file on embedded defaults, without a server (like vllm run-batch)."""
    sys.exit(run_batch(get_settings(), input_path, output_path, workers=workers))
