"""Jobs: energy_share, the part of its GPU's measured energy and time a job is charged when
other jobs shared the GPU with it (continuous batching, grouped embeddings)

Revision ID: 0009_energy_share
Revises: 0008_stats_finer_rollups
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_energy_share"
down_revision = "0008_stats_finer_rollups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("energy_share", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("energy_share")
