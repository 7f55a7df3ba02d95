"""`gpuq keys`: API keys, managed straight in the database (so the first admin key can be
made before any server runs, or when every admin key is lost)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from sqlalchemy.orm import Session


@contextmanager
def _session() -> Iterator[Session]:
    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.settings import get_settings

    engine = sync_engine(get_settings().database_url)
    try:
        with sync_sessions(engine)() as session:
            yield session
    finally:
        engine.dispose()


@click.group()
def keys() -> None:
    """Create, list and revoke API keys (works on the database directly)."""


@keys.command("create")
@click.option("--name", required=True, help="what the key is for")
@click.option("--owner", required=True, help="the tenant it acts for")
@click.option("--role", type=click.Choice(["admin", "submitter"]), default="submitter", show_default=True)
@click.option("--max-queued-jobs", type=click.IntRange(min=1), default=None, help="jobs it may have queued")
@click.option("--max-per-minute", type=click.IntRange(min=1), default=None, help="submissions a minute")
@click.option(
    "--default-priority",
    type=click.Choice(["high", "normal", "low"]),
    default=None,
    help="priority of its jobs and interactive calls that name none [default: normal for jobs, high for calls]",
)
def keys_create(
    name: str,
    owner: str,
    role: str,
    max_queued_jobs: int | None,
    max_per_minute: int | None,
    default_priority: str | None,
) -> None:
    """Create a key and print its secret (shown this once)."""
    from gpuq import store
    from gpuq.db.tables import Role
    from gpuq.jobs.queues import Priority

    with _session() as session:
        key, secret = store.create_api_key(
            session,
            name=name,
            owner=owner,
            role=Role(role),
            max_queued_jobs=max_queued_jobs,
            max_submissions_per_minute=max_per_minute,
            default_priority=Priority.parse(default_priority) if default_priority else None,
        )
    click.echo(f"created {key.id} ({role} for {owner}); the secret, shown this once:", err=True)
    click.echo(secret)


@keys.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="include revoked keys")
def keys_list(include_revoked: bool) -> None:
    from gpuq import store

    with _session() as session:
        rows = store.list_api_keys(session, include_revoked=include_revoked)
    for k in rows:
        state = "revoked" if k.revoked_at else "active"
        click.echo(f"{k.id}  {k.key_prefix}…  {k.role:<9}  {k.owner:<16}  {state:<7}  {k.name}")


@keys.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id: str) -> None:
    """Revoke a key; it stops working at once."""
    from gpuq import store

    with _session() as session:
        if not store.revoke_api_key(session, key_id):
            raise click.ClickException(f"key {key_id!r} does not exist or is already revoked")
    click.echo(f"revoked {key_id}")
