"""``gpuq db``: the database schema, and its retention."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpuq.cli.errors import stop
from gpuq.settings import get_settings

if TYPE_CHECKING:
    from gpuq.retention import Pruned


@click.group()
def db() -> None:
    """Database schema (Alembic) and retention."""


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
        from alembic.util import CommandError

        try:
            migrate.upgrade(settings.database_url, revision)
        except CommandError as exc:  # an unknown revision, mostly
            stop(f"{exc} (`gpuq db upgrade` alone goes to the latest)")
    click.echo(f"database at {revision}: {settings.database_url}")


@db.command("prune")
@click.option("--older-than", "older_than", required=True, help="age past which history goes, e.g. 90d, 12w or 36h")
@click.option("--dry-run", is_flag=True, help="count what would be deleted; delete nothing")
def db_prune(older_than: str, dry_run: bool) -> None:
    """Delete finished jobs, batches (with their jobs), unreferenced files, settled webhook
    deliveries, GPU samples, schedule runs and worker events that ended longer ago than --older-than, in
    short transactions. The stats rollups are kept, so /v1/stats still counts them."""
    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.retention import parse_age, prune

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    engine = sync_engine(get_settings().database_url)
    try:
        with sync_sessions(engine)() as session:
            report = prune(session, older_than=age, dry_run=dry_run)
    finally:
        engine.dispose()
    _print_pruned(report)


def _print_pruned(report: Pruned) -> None:
    cutoff = f"{report.before:%Y-%m-%d %H:%M} UTC"
    verb = "would delete" if report.dry_run else "deleted"
    click.echo(f"{verb} the history that ended before {cutoff} (stats rollups kept):")
    rows = [
        ("jobs", report.jobs, "outside batches"),
        ("batches", report.batches, f"with their {report.batch_jobs:,} jobs"),
        ("files", report.files, f"{report.file_bytes / 1_048_576:,.1f} MiB"),
        ("webhook deliveries", report.webhook_deliveries, "delivered or given up"),
        ("GPU samples", report.gpu_samples, ""),
        ("schedule runs", report.schedule_runs, ""),
        ("worker events", report.worker_events, "starts, exits, drains, GPU marks"),
    ]
    for name, count, note in rows:
        click.echo(f"  {name:<20}{count:>12,}  {note}".rstrip())
    if report.files_missing:
        missing = report.files_missing
        click.echo(f"  {len(missing)} of those files were not on this machine's disk, e.g. {missing[0]}")
    if report.held_back_by_rollups:
        asked = f"{report.requested_before:%Y-%m-%d %H:%M} UTC"
        click.echo(
            f"  {'keeps' if report.dry_run else 'kept'} everything from {cutoff} on, though {asked} was asked: "
            "the stats rollups end there (each day is rolled up 15 minutes after it ends)"
        )
