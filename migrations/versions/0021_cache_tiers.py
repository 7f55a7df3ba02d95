"""Jobs: of the prompt tokens taken from a cache (cached_tokens), how many were restored from
the prefix cache's host-RAM tier and how many from its disk tier (the rest came from a KV
stream); and how long a job waited parked, its slot given to a more urgent job (parked_ms)

Revision ID: 0021_cache_tiers
Revises: 0020_fairness
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_cache_tiers"
down_revision = "0020_fairness"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cached_ram_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cached_disk_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("parked_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("parked_ms")
        batch.drop_column("cached_disk_tokens")
        batch.drop_column("cached_ram_tokens")
