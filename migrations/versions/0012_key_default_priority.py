"""API keys: default_priority, the priority of the key's jobs and interactive calls when a
request names none (null: gpuq's defaults, `normal` for jobs, `high` for interactive calls)

Revision ID: 0012_key_default_priority
Revises: 0011_vram_per_gpu
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_key_default_priority"
down_revision = "0011_vram_per_gpu"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("default_priority", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("default_priority")
