"""`gpuq batch ...` and `gpuq run-batch`: batches from the command line, with a progress bar."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import click

from gpuq.cli.client import ApiError, GpuqClient
from gpuq.cli.support import connect
from gpuq.settings import Settings

FINAL = {"completed", "failed", "expired", "cancelled"}


def first_endpoint(path: str) -> str:
    """A batch's `endpoint` is its first line's (lines may mix endpoints in gpuq)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                return str(json.loads(raw).get("url", "/v1/chat/completions"))
    raise click.ClickException(f"{path} has no lines")


def follow(client: GpuqClient, batch_id: str) -> dict:
    """Poll the batch, drawing a progress bar of answered lines on stderr, until it ends."""
    batch = client.batch(batch_id)
    total = batch["request_counts"]["total"]
    shown = 0
    with click.progressbar(length=total, label=batch_id, file=sys.stderr, show_pos=True, show_eta=True) as bar:
        while True:
            counts = batch["request_counts"]
            done = counts["completed"] + counts["failed"]
            bar.update(done - shown)
            shown = done
            if batch["status"] in FINAL:
                return batch
            time.sleep(0.5)
            batch = client.batch(batch_id)


def summary(batch: dict) -> str:
    counts = batch["request_counts"]
    return (
        f"{batch['id']} {batch['status']}: {counts['completed']} completed, {counts['failed']} failed "
        f"of {counts['total']}"
    )


def submit(url: str, path: str, *, wait: bool, priority: str) -> None:
    with connect(url) as client:
        try:
            file = client.upload(path)
            batch = client.create_batch(file["id"], endpoint=first_endpoint(path), priority=priority)
        except ApiError as exc:
            raise click.ClickException(f"{exc.detail} (HTTP {exc.status})") from None
        click.echo(batch["id"])
        if wait:
            click.echo(summary(follow(client, batch["id"])), err=True)


def run_batch(settings: Settings, input_path: str, output_path: str, *, workers: int) -> int:
    """Run a whole file on embedded defaults, without a server: like `vllm run-batch`."""
    from gpuq.local.demo import serve_api
    from gpuq.local.embedded import embedded_system

    with tempfile.TemporaryDirectory(prefix="gpuq-run-batch-") as tmp:
        if not {"data_dir", "database_url"} & settings.model_fields_set:  # nothing to keep: a throwaway database
            settings = settings.model_copy(update={"data_dir": Path(tmp), "database_url": f"sqlite:///{tmp}/gpuq.db"})
        with (
            embedded_system(settings, workers=workers) as system,
            serve_api(system.settings) as url,
            GpuqClient(url, api_key=system.api_key) as client,
        ):
            client.wait_ready()
            file = client.upload(input_path)
            batch = client.create_batch(file["id"], endpoint=first_endpoint(input_path), priority="normal")
            final = follow(client, batch["id"])
            Path(output_path).write_text(client.batch_results(batch["id"]))
    click.echo(summary(final) + f"; results in {output_path}", err=True)
    return 0 if final["status"] == "completed" else 1
