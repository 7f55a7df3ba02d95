"""Alembic environment: the URL comes from gpuq's settings (or the caller), metadata from gpuq.db.tables."""

from __future__ import annotations

from alembic import context

from gpuq.db.engine import sync_engine
from gpuq.db.tables import Base
from gpuq.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sync_engine(url)
    with engine.connect() as connection:
        # render_as_batch lets the same ALTERs run on SQLite, which cannot alter columns in place.
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
