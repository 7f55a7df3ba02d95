"""``gpuq db``: the database schema."""

from __future__ import annotations

import click

from gpuq.cli.errors import stop
from gpuq.settings import get_settings


@click.group()
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
        from alembic.util import CommandError

        try:
            migrate.upgrade(settings.database_url, revision)
        except CommandError as exc:  # an unknown revision, mostly
            stop(f"{exc} (`gpuq db upgrade` alone goes to the latest)")
    click.echo(f"database at {revision}: {settings.database_url}")
