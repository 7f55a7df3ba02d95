"""Schema changes go through Alembic only; this wraps it for the CLI, the API start and tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from gpuq.private_files import prepare_sqlite_file


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser treats % as interpolation; URLs may carry %-escapes in passwords.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    prepare_sqlite_file(database_url)  # created 0600, in a 0700 directory if it is new
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
