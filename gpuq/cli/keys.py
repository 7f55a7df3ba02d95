"""`gpuq keys`: API keys, managed straight in the database (so the first admin key can be
made before any server runs, or when every admin key is lost)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from sqlalchemy.orm import Session

from gpuq.cli.errors import stop
from gpuq.cli.support import connect, table, url_option


@contextmanager
def _session() -> Iterator[Session]:
    """A session on gpuq's database, which must exist and be migrated: these commands never
    create one (a stray empty SQLite file where the data directory was not would help nobody)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.settings import get_settings

    settings = get_settings()
    url = make_url(settings.database_url)
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).is_file():
        stop(
            f"no gpuq database at {Path(url.database).resolve()}: run this where `gpuq up` ran "
            "(its data directory, GPUQ_DATA_DIR, defaults to ./data), or set GPUQ_DATA_DIR or GPUQ_DATABASE_URL"
        )
    engine = sync_engine(settings.database_url)
    try:
        with sync_sessions(engine)() as session:
            yield session
    except (OperationalError, ProgrammingError) as exc:
        reason = str(exc.orig).strip().splitlines()[0]
        stop(f"cannot use the database at {shown} ({reason}); `gpuq db upgrade` creates its tables")
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
@click.option(
    "--weight",
    type=click.IntRange(min=1, max=1000),
    default=1,
    show_default=True,
    help="its tenant's share beside other tenants' jobs of the same priority (a tenant weighs as its heaviest key)",
)
def keys_create(
    name: str,
    owner: str,
    role: str,
    max_queued_jobs: int | None,
    max_per_minute: int | None,
    default_priority: str | None,
    weight: int,
) -> None:
    """Create a key and print its secret (shown this once)."""
    from gpuq import store
    from gpuq.db.tables import Role
    from gpuq.queue_names import Priority

    with _session() as session:
        same = store.active_key_named(session, owner=owner, name=name)
        if same is not None:
            stop(
                f"{owner} already has an active key named {name!r} ({same.id}): choose another name, or revoke that key"
            )
        key, secret = store.create_api_key(
            session,
            name=name,
            owner=owner,
            role=Role(role),
            max_queued_jobs=max_queued_jobs,
            max_submissions_per_minute=max_per_minute,
            default_priority=Priority.parse(default_priority) if default_priority else None,
            weight=weight,
        )
    click.echo(f"created {key.id} ({role} for {owner}); the secret, shown this once:", err=True)
    click.echo(secret)


@keys.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="include revoked keys")
def keys_list(include_revoked: bool) -> None:
    """The keys (their first characters, never the secret)."""
    from gpuq import store

    with _session() as session:
        rows = store.list_api_keys(session, include_revoked=include_revoked)
    table(
        ("ID", "PREFIX", "ROLE", "OWNER", "WEIGHT", "STATE", "NAME"),
        [
            (
                k.id,
                f"{k.key_prefix}…",
                str(k.role),
                k.owner,
                str(k.weight),
                "revoked" if k.revoked_at else "active",
                k.name,
            )
            for k in rows
        ],
        empty="no API keys" + ("" if include_revoked else " (`--all` shows revoked ones too)"),
    )


@keys.command("weight")
@click.argument("key_id")
@click.argument("weight", type=click.IntRange(min=1, max=1000))
def keys_weight(key_id: str, weight: int) -> None:
    """Set a key's weight: its tenant's share of the fleet beside other tenants' jobs of the
    same priority. Workers follow it at the scheduler's next pass (`PATCH /v1/keys/{id}`: at once)."""
    from gpuq import store

    with _session() as session:
        key = store.set_key_weight(session, key_id, weight)
        if key is None:
            stop(f"key {key_id!r} does not exist or is revoked (`gpuq keys list --all` shows every key)")
    click.echo(f"{key_id} ({key.owner}) weighs {weight}")


@keys.command("revoke")
@click.argument("key_id")
@click.option(
    "--cancel-jobs",
    is_flag=True,
    help="also cancel every queued or running job it submitted (through the API, with the admin key)",
)
@url_option
def keys_revoke(key_id: str, cancel_jobs: bool, url: str) -> None:
    """Revoke a key; it stops working at once. Its jobs run on unless --cancel-jobs."""
    from gpuq import store

    with _session() as session:
        revoked = store.revoke_api_key(session, key_id)
        if not revoked and not (cancel_jobs and store.get_api_key(session, key_id)):
            stop(f"key {key_id!r} does not exist or is already revoked (`gpuq keys list --all` shows every key)")
    if revoked:
        click.echo(f"revoked {key_id}")
    if cancel_jobs:
        # Running jobs are stopped by their workers, told through Redis: the API knows where
        # Redis is (a private one under `gpuq up`), this command may not.
        with connect(url) as client:
            client.cancel_jobs_of_key(key_id)
        click.echo(f"cancelled the queued and running jobs of {key_id}")
